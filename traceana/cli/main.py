"""The `traceana` command line: the typer app, the entry point that turns errors into one line and an exit code, and
the list of commands. Each command lives in the module of its group (traceana/cli/*.py) and is thin: parse options,
call the module that owns the concept, print."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated

import typer

from traceana.cli import analyses, breakdown, calibrate, compare, estimate, export, ingest, replay, runs, synth
from traceana.errors import TraceanaError

app = typer.Typer(help="Trace-driven analyzer for distributed LLM training.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)


def _print_version(asked: bool) -> None:
    if asked:
        from traceana.about import version

        typer.echo(f"traceana {version()}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print traceana's version and exit.")] = False) -> None:
    """Trace-driven analyzer for distributed LLM training."""

# The commands, in the order `traceana --help` lists them.
for command in (ingest.ingest, runs.runs, runs.info, runs.sql, breakdown.breakdown, breakdown.timeline,
                breakdown.stragglers, estimate.estimate, estimate.search, compare.compare, export.export,
                export.report, calibrate.calibrate, synth.synth, export.import_parquet):
    app.command()(command)
app.command("critical-path")(analyses.critical_path)
app.command()(analyses.ops)
for command in (analyses.comm, analyses.kernels, analyses.idle, analyses.memory, analyses.diff, replay.replay,
                replay.whatif, replay.predict, replay.advise, runs.mcp):
    app.command()(command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user mistakes become one line on stderr and exit code 2, never a traceback. Anything else is a
    bug: one line and exit code 1, the traceback only with TRACEANA_DEBUG=1."""
    try:
        app(args=argv, prog_name="traceana")
    except TraceanaError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except Exception as exc:
        if _overflow(exc):  # only a store changed by hand holds such values: ingest bounds every time and size
            args = list(sys.argv[1:] if argv is None else argv)
            db = args[args.index("--db") + 1] if "--db" in args[:-1] else "traceana.duckdb"
            typer.echo(f"error: {db}: a sum over the store's rows is past 2^63 (times or sizes no ingested trace "
                       "holds: a store written or changed by other means?)", err=True)
            raise SystemExit(2) from None
        line = next(iter(str(exc).strip().splitlines()), "")
        if os.environ.get("TRACEANA_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        elif isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryException":
            typer.echo(f"error: out of memory: the run is larger than this command can hold on this machine "
                       f"({type(exc).__name__}{': ' + line if line else ''}); docs/performance.md gives each "
                       "command's memory at scale", err=True)
        else:
            typer.echo(f"error: internal error: {type(exc).__name__}: {line} "
                       "(run again with TRACEANA_DEBUG=1 for the traceback)", err=True)
        raise SystemExit(1) from None


def _overflow(exc: Exception) -> bool:
    """DuckDB's integer overflow while reading the store (duckdb is not imported here: --help stays light)."""
    return "duckdb" in type(exc).__module__ and type(exc).__name__ in ("ConversionException",
                                                                               "OutOfRangeException")
