"""The `idle` command: why the device was idle. IDLE (nothing counted as work or communication runs) split by
cause, per rank and step or per rank's typical step, from the view idle_gaps: host-bound launch gaps (the next
kernel was launched only after the device ran dry), sync waits, work that was queued but waited, and gaps at step
boundaries. Without launch records (CPU-only runs, formats without runtime correlation) interior gaps stay
'unknown', and the command says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import duckdb
import polars as pl
import typer

from traceana import store
from traceana.breakdown import check_step
from traceana.cli import DbOption, JsonOption, RunArgument
from traceana.errors import TraceanaError
from traceana.output import emit, emit_json

CAUSES = ("host_launch", "sync_wait", "queued", "step_boundary", "unknown")


def idle_causes(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> pl.DataFrame:
    """Per rank: IDLE and each cause's share of it, in ms, for step ``step`` or the typical step (the mean over the
    rank's steps after the first, as rank_breakdown takes it)."""
    if step is not None:
        check_step(con, run_id, step)
    sums = ", ".join(f"coalesce(sum(end_ns - start_ns) FILTER (WHERE cause = '{c}'), 0) AS {c}_ns" for c in CAUSES)
    means = ", ".join(f"avg({c}_ns) / 1e6 AS {c}_ms" for c in CAUSES)
    try:
        return con.sql(f"""
            WITH per_step AS (
                SELECT b.rank, b.pp, b.step, b.IDLE_ns, {sums}, count(g.start_ns) AS gaps,
                       count(*) OVER (PARTITION BY b.rank) = 1 OR b.step > min(b.step) OVER (PARTITION BY b.rank)
                           AS steady
                FROM rank_step_breakdown b
                LEFT JOIN idle_gaps g USING (run_id, rank, step)
                WHERE b.run_id = $run
                GROUP BY b.rank, b.pp, b.step, b.IDLE_ns
            )
            SELECT rank, pp, count(*)::INTEGER AS steps, avg(gaps) AS gaps, avg(IDLE_ns) / 1e6 AS IDLE_ms, {means}
            FROM per_step
            WHERE CASE WHEN $step IS NULL THEN steady ELSE step = $step END
            GROUP BY rank, pp ORDER BY rank""", params={"run": run_id, "step": step}).pl()
    except duckdb.CatalogException:
        raise TraceanaError(store.OUTDATED) from None


def idle(
    run: RunArgument = None,
    step: Annotated[int | None, typer.Option("--step", help="One step (default: mean over steps after the first).")]
    = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Why the device was idle: IDLE per rank split into host-bound launch gaps, sync waits, queued work waiting,
    and step-boundary gaps (ms and % of IDLE)."""
    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        frame = idle_causes(con, rid, step)
        launches = con.execute("SELECT count(launch_ns) FROM device_events WHERE run_id = ?", [rid]).fetchall()[0][0]
    if frame.is_empty():
        raise TraceanaError(f"run {rid!r} has no device events, so no idle time")
    note = None if launches else ("no launch records in this run (CPU-only, or a format without runtime "
                                  "correlation): interior gaps are left whole as 'unknown'")
    which = f"step {step}" if step is not None else "typical step (mean over steps after the first)"
    if json:
        emit_json({"run_id": rid, "step": step, "note": note, "ranks": frame.to_dicts()})
        return
    shares = [pl.format("{} ({}%)", pl.col(f"{c}_ms").round_sig_figs(4),
                        (100 * pl.col(f"{c}_ms") / pl.col("IDLE_ms")).round(1).fill_nan(None)).alias(f"{c} ms (%)")
              for c in CAUSES if frame[f"{c}_ms"].sum() > 0]
    emit(frame.select("rank", "pp", "steps", "gaps", pl.col("IDLE_ms").round_sig_figs(4), *shares),
         title=f"{rid}: why the device was idle, {which}")
    if note:
        typer.echo(f"note: {note}")
