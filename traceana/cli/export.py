"""`traceana export`, `import-parquet` and `report`: a measured run, or the whole store, in a format other tools
open, a Parquet dataset back into a store, and one HTML file about a run to share. Each format is its own module
(--perfetto: traceana/render/perfetto.py; --parquet: traceana/store/dataset.py, which `import-parquet` reads back;
report --html: traceana/render/report/run.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, RunArgument
from traceana.errors import TraceanaError
from traceana.render.console import html_path, progress


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
    perfetto: Annotated[Path | None, typer.Option("--perfetto", help="Write the run as Trace Event Format JSON for "
                                                  "ui.perfetto.dev / chrome://tracing (.json, or .json.gz).")] = None,
    steps: Annotated[str | None, typer.Option("--steps", help="Only steps A-B (inclusive), or one step A.")] = None,
    parquet: Annotated[Path | None, typer.Option("--parquet", help="Write every table of the store as a Parquet "
                                                 "dataset folder (Hive-partitioned by run and rank).")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="With --parquet: overwrite an existing folder.")] = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Export a measured run for Perfetto (every rank on the aligned clock, named by its coordinates, its step
    windows, each host thread's tree of CPU ops and NVTX ranges, its streams and communication tracks coloured by
    dim, arrows from each kernel's launching CPU op to the kernel and between each collective's members), or the
    whole store as Parquet (all or nothing: a hidden folder renamed into place)."""
    if (perfetto is None) == (parquet is None):
        raise TraceanaError("choose what to write: --perfetto OUT.json[.gz] (one run) or --parquet DIR (the store)")
    if parquet is not None:
        if run is not None or steps is not None:
            raise TraceanaError("--parquet writes the whole store: RUN and --steps go with --perfetto")
        _parquet(db, parquet, replace)
        return
    window = parse_steps(steps) if steps is not None else None
    if not perfetto.parent.is_dir():  # checked before the run is read, as --plot is
        raise TraceanaError(f"--perfetto {perfetto}: {perfetto.parent} is not a folder that exists")
    from traceana.render.perfetto import export as write_perfetto

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        done = write_perfetto(con, rid, perfetto, window)
    typer.echo(f"wrote {done.path} ({rid}: {done.ranks} ranks, {done.slices} slices on {done.tracks} tracks, "
               f"{done.step_slices} step windows, {done.flows} collective members linked, "
               f"{done.path_slices} critical path segments, {done.host_slices} host ranges on {done.host_tracks} "
               f"host tracks, {done.launches} kernels linked to their launching host range)")
    if done.outside:  # before the first window or after the last one (the step windows tile the rest)
        typer.echo(f"note: {done.outside:,} device events outside the exported step windows are not in the file")
    if done.host_cap is None:
        typer.echo("note: no host threads: this store was ingested before traceana kept the host's ranges with "
                   "their thread; ingest the run again to see its CPU ops above the device")
    if done.host_capped:
        typer.echo(f"note: {done.host_capped:,} host ranges are not in the file: a rank keeps its {done.host_cap:,} "
                   "shallowest (the top levels of each thread's tree, then the earliest); export fewer --steps to "
                   "see deeper ones")


def _parquet(db: Path, folder: Path, replace: bool) -> None:
    from traceana.store import dataset

    if dataset.is_dataset(db):
        raise TraceanaError(f"{db}: already a Parquet dataset (copy the folder, or import-parquet it into a store)")
    with store.connect(db, read_only=True, views=False) as con, progress(None, "exporting") as advance:
        counts = dataset.export(con, folder, replace, advance)
    typer.echo(f"{db} -> {folder}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))


def import_parquet(
    source: Annotated[Path, typer.Argument(help="Dataset folder written by `traceana export --parquet`.")],
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Read a Parquet dataset into the store, replacing the runs and estimates it holds (one transaction)."""
    from traceana.store import dataset

    with store.connect(db) as con, progress(None, "importing") as advance:
        counts = dataset.import_dataset(con, source, advance)
    typer.echo(f"{source} -> {db}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))


def report(
    html: Annotated[Path, typer.Option("--html", help="HTML file to write (self-contained and interactive: opens "
                                       "offline).", callback=html_path)],
    run: RunArgument = None,
    estimate: Annotated[Path | None, typer.Option("--estimate", help="Job YAML: add estimate vs measured.")] = None,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """One interactive HTML file to share: where the time went and what to change first, then the stage, rank and
    step breakdowns (click to drill down), the timeline with the critical path, communication, kernels, idle,
    memory and, with --estimate, estimate vs measured."""
    from traceana.api import Traces

    traces = Traces(db, run)
    with traces.session():
        rid = traces.read(None, lambda _con, rid: rid)
        size = traces.report(html, estimate, run=rid)
    typer.echo(f"wrote {html} ({rid}; {size / 1e6:.1f} MB)")
