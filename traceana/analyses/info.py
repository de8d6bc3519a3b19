"""What a run holds, as `traceana info` lists it (and `traceana mcp`'s info tool): its ranks with coordinates, steps,
process groups with dims, device events by category, collectives by op and dim, and the ingest's notes."""

from __future__ import annotations

import duckdb
import polars as pl

# The tables, one query each over the run's rows ($r: its id).
PARTS = {
    "ranks": "SELECT rank, host, device, pid, clock_offset_ns, tp, cp, ep, dp, pp, rank_source "
             "FROM ranks WHERE run_id=$r ORDER BY rank",
    "steps": "SELECT step, count(*) AS ranks, round(avg(end_ns - start_ns) / 1e6, 3) AS mean_ms, "
             "round(max(end_ns - start_ns) / 1e6, 3) AS max_ms, bool_and(from_markers) AS from_markers "
             "FROM step_windows WHERE run_id=$r GROUP BY step ORDER BY step",
    # streams: a column stores written before it existed lack, hence COLUMNS (source is always there); pg ids are
    # text (Ascend names its groups), numeric ones sort as numbers (9 before 10), named ones after them
    "process_groups": "SELECT pg, dim, name, ranks, COLUMNS(lambda c: c IN ('source', 'streams')) "
                      "FROM process_groups WHERE run_id=$r ORDER BY dim, TRY_CAST(pg AS HUGEINT) NULLS LAST, pg",
    "events by category": "SELECT category, count(*) AS events, sum(end_ns-start_ns)/1e6 AS busy_ms "
                          "FROM device_events WHERE run_id=$r GROUP BY ALL ORDER BY events DESC",
    "collectives by op and dim": "SELECT op, kernel_op, dim, evidence, count(*) AS events, "
                                 "sum(bytes) AS bytes FROM collectives WHERE run_id=$r "
                                 "GROUP BY ALL ORDER BY events DESC, op, kernel_op, dim, evidence",
}


def tables(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """(each of PARTS' tables, the run's notes) on a connection that shows run ``rid``."""
    frames = {title: con.sql(sql, params={"r": rid}).pl() for title, sql in PARTS.items()}
    notes = con.execute("SELECT notes FROM runs WHERE run_id=$r", {"r": rid}).fetchall()[0][0]
    return frames, notes or []
