"""Behind `traceana idle`: why the device was idle. IDLE (nothing counted as work or communication runs) split by
cause, per rank and step or per rank's typical step, from the view idle_gaps: host-bound launch gaps (the next
kernel was launched only after the device ran dry), sync waits, work that was queued but waited, and gaps at step
boundaries. Without launch records (CPU-only runs, formats without runtime correlation) interior gaps stay
'unknown', and the report says so.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana import store
from traceana.analyses.breakdown import check_step
from traceana.errors import TraceanaError

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
