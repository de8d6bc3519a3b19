"""`traceana export`: a measured run in a format other tools open. Each format is an option and its own module
(--perfetto: traceana/perfetto.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli import DbOption, RunArgument
from traceana.errors import TraceanaError


def parse_steps(text: str) -> tuple[int, int]:
    """'A-B' (inclusive) or 'A' -> (A, B); a one-line error otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not match:
        raise TraceanaError(f"--steps {text!r}: expected A-B or A (step numbers, as `traceana info` lists them)")
    lo, hi = int(match[1]), int(match[2] or match[1])
    if hi < lo:
        raise TraceanaError(f"--steps {text!r}: the first step is after the last")
    return lo, hi


def export(
    run: RunArgument = None,
    perfetto: Annotated[Path | None, typer.Option("--perfetto", help="Write Trace Event Format JSON for "
                                                  "ui.perfetto.dev / chrome://tracing (.json, or .json.gz).")] = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Only steps A-B (inclusive), or one step A.")] = None,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Export a measured run: every rank on the aligned clock, named by its coordinates, its streams and
    communication tracks coloured by dim, step windows, and arrows linking each collective's members."""
    if perfetto is None:
        raise TraceanaError("choose what to write: --perfetto OUT.json[.gz]")
    window = parse_steps(steps) if steps is not None else None
    from traceana.perfetto import export as write_perfetto

    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        done = write_perfetto(con, rid, perfetto, window)
    typer.echo(f"wrote {done.path} ({rid}: {done.ranks} ranks, {done.slices} slices on {done.tracks} tracks, "
               f"{done.step_slices} step windows, {done.flows} collective members linked)")
