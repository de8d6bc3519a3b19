"""The option and argument types every command shares (--db, --json, --layout, the RUN argument), in a module of
their own so that command modules import them and never the main one (traceana/cli/main.py imports the commands)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana.errors import TraceanaError

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
