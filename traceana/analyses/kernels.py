"""Behind `traceana kernels`: the kernels that took the most device time, by short name (view kernel_names: templates
and argument lists cut, so versions of one kernel add up), over the whole run or per pipeline stage (view
kernel_totals; variants: the most distinct full names merged on one rank). Shares are of COMP, the union of
compute / memcpy / memset time over the same ranks and steps, so kernels on concurrent streams can add up to more
than 100%.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.errors import TraceanaError

WORK = ("compute", "memcpy", "memset")


def top_kernels(con: duckdb.DuckDBPyConnection, run_id: str, top: int, by_stage: bool = False) -> pl.DataFrame:
    """The ``top`` kernels by total time, over the run or per stage (column ``stage``), with calls, mean, share of
    COMP and time per rank and step."""
    stage = "pp" if by_stage else "NULL::INTEGER"
    return con.sql(f"""
        WITH t AS (SELECT *, {stage} AS stage FROM kernel_totals WHERE run_id = $run),
        scope AS (SELECT stage, sum(steps) AS rank_steps, sum(rank_COMP_ns) AS COMP_ns
                  FROM (SELECT DISTINCT rank, stage, steps, rank_COMP_ns FROM t) GROUP BY stage)
        SELECT t.stage, short_name, category, count(DISTINCT rank) AS ranks, max(variants) AS variants,
               sum(calls)::BIGINT AS calls, sum(total_ns) / 1e6 AS total_ms,
               sum(total_ns) / sum(calls) / 1e3 AS mean_us,
               max(max_ns) / 1e3 AS max_us, sum(total_ns) / any_value(s.rank_steps) / 1e6 AS per_rank_step_ms,
               CASE WHEN category IN {WORK} THEN 100 * sum(total_ns) / nullif(any_value(s.COMP_ns), 0) END
                   AS share_of_COMP_pct
        FROM t JOIN scope s ON s.stage IS NOT DISTINCT FROM t.stage
        GROUP BY t.stage, short_name, category
        QUALIFY row_number() OVER (PARTITION BY t.stage ORDER BY sum(total_ns) DESC, short_name) <= $top
        ORDER BY t.stage NULLS FIRST, total_ms DESC, short_name""", params={"run": run_id, "top": top}).pl()


def ranking(con: duckdb.DuckDBPyConnection, run_id: str, top: int, by: str) -> pl.DataFrame:
    """:func:`top_kernels` as `traceana kernels --by run|stage` shows it (no stage column over the whole run)."""
    if by not in ("run", "stage"):
        raise TraceanaError(f"--by {by!r}: choose run or stage")
    if top < 1:
        raise TraceanaError(f"--top {top}: must be >= 1")
    frame = top_kernels(con, run_id, top, by_stage=by == "stage")
    return frame.drop("stage") if by == "run" else frame
