"""Behind `traceana memory`: allocated and reserved memory over time per rank (the memory table: Kineto [memory]
samples, Ascend PTA records, CPU samples of CPU-only runs) and each step's peak (view memory_peaks), which
`breakdown --json` also carries per rank."""

from __future__ import annotations

import duckdb
import polars as pl


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
