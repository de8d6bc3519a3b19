"""The option and argument types every command shares (--db, --json, --layout, --step, --top, --plot, the RUN
argument), in a module of their own so that command modules import them and never the main one (traceana/cli/main.py
imports the commands). One definition each, so that a name means the same and takes the same values everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.models import OptionInfo

from traceana.errors import TraceanaError
from traceana.render.console import plot_path

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file, or a Parquet dataset: a folder, or a name "
                                         "ending in .parquet.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LayoutOption = Annotated[str | None, typer.Option(help='Parallel layout, e.g. "tp=2,dp=2,pp=2,order=tp-cp-ep-dp-pp".')]
RunArgument = Annotated[str | None, typer.Argument(help="Run id (default: the latest ingested run).")]

MAX_TOP = 1_000_000  # more rows than any table a command lists; past int64 the frames' head() overflowed


def top_count(value: int) -> int:
    """The callback of every --top: how many rows to list, checked before any work."""
    if value < 1:
        raise TraceanaError(f"--top {value}: must be at least 1")
    if value > MAX_TOP:
        raise TraceanaError(f"--top {value}: more rows than any table lists; at most {MAX_TOP:,}")
    return value


def step_option(default: str, every: bool = False) -> OptionInfo:
    """The --step of every command that reports on steps: a step number or 'median' (and 'all' with ``every``),
    checked before any work; traceana.analyses.breakdown.resolve_step turns it into a step number."""

    def parse(text: str) -> str:
        from traceana.analyses.breakdown import step_form  # here: `traceana --help` loads no Polars

        return str(step_form(text, every))

    words = "'median' (the steady step whose TOTAL is the median of those the typical step averages)"
    forms = f"A step number, {words}, or 'all' (every step)" if every else f"A step number, or {words}"
    return typer.Option("--step", parser=parse, metavar="N|median|all" if every else "N|median",
                        help=f"{forms}; default: {default}.")


StepOption = Annotated[str | None, step_option("the typical step, the mean over steps after the first")]
OneStepOption = Annotated[str | None, step_option("the second step (the first carries warm-up), or the only one")]


def plot_option(what: str) -> OptionInfo:
    """The --plot of every command that draws: one help shape, the file checked before any work (plot_path)."""
    return typer.Option("--plot", help=f"Write {what} to this PNG (or .svg, .pdf).", callback=plot_path)
