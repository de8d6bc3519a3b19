"""The `memory` command: allocated and reserved memory over time per rank (the memory table: Kineto [memory]
samples, Ascend PTA records, CPU samples of CPU-only runs) and each step's peak (view memory_peaks), which
`breakdown --json` also carries per rank."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import polars as pl
import typer

from traceana import store
from traceana.cli import DbOption, JsonOption, RunArgument
from traceana.errors import TraceanaError
from traceana.output import emit


def peaks(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """memory_peaks of one run, per rank and step."""
    return con.sql("SELECT * EXCLUDE (run_id) FROM memory_peaks WHERE run_id = ? ORDER BY rank, step",
                   params=[run_id]).pl()


def rank_peaks(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None) -> pl.DataFrame:
    """Per rank: the peak of step ``step``, or the largest over the steps a typical step averages (after the
    first); a peak is a maximum, so it is not averaged."""
    return con.sql(
        "SELECT rank, max(peak_allocated_bytes) AS peak_allocated_bytes, max(peak_reserved_bytes) AS "
        "peak_reserved_bytes FROM memory_peaks m WHERE run_id = $run AND CASE WHEN $step IS NULL THEN "
        "(step > (SELECT min(step) FROM memory_peaks p WHERE p.run_id = m.run_id AND p.rank = m.rank) OR "
        "(SELECT count(*) FROM memory_peaks p WHERE p.run_id = m.run_id AND p.rank = m.rank) = 1) "
        "ELSE step = $step END GROUP BY rank", params={"run": run_id, "step": step}).pl()


def memory(
    run: RunArgument = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write allocated and reserved over time to this PNG.")]
    = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Peak allocated and reserved memory per rank and step, and the timeline of both (--plot)."""
    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        frame = peaks(con, rid)
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no memory samples (Kineto needs profile_memory=True; Ascend "
                                "needs the allocator records)")
        if plot is not None:
            samples = con.sql("SELECT rank, ts_ns, allocated_bytes, reserved_bytes FROM memory WHERE run_id = ? "
                              "ORDER BY rank, ts_ns", params=[rid]).pl()
            windows = con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = ?",
                              params=[rid]).pl()
    if plot is not None:
        from traceana.plots import memory_timeline

        memory_timeline(samples, windows, plot, f"{rid}: allocator memory per rank")
    if json:
        emit(frame, fmt="json")
    else:
        sizes = [c for c in frame.columns if c.endswith("_bytes")]
        emit(frame.with_columns((pl.col(c) / 2**20).round(1).alias(c.replace("_bytes", "_MiB")) for c in sizes)
             .drop(sizes), title=f"{rid}: memory per rank and step (MiB = 2^20 bytes)")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)

