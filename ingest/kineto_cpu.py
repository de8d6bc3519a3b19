"""CPU-only PyTorch profiler runs (gloo): the process is the device.

Compute is the main thread's outermost CPU ops (nested ops are inside their parent, so never counted twice; the
host side of communication calls is not compute). Communication is the ``gloo:*`` ranges that gloo's worker threads
record. Those ranges carry op and shape but no process group, so the group is inferred by timing (evidence
``timing-match``): every worker thread serves one group, and a collective cannot end on one member before it has
started on every other member. For each worker thread and each candidate group of its rank, count the thread's ops
whose partners (same op and size; Send<->Recv for point-to-point) overlap them on all other members (on one member
for point-to-point); the group with the best share wins, closest end times breaking ties.
"""

from __future__ import annotations

import duckdb
import polars as pl
from traceana.ingest.comm_names import DTYPE_BYTES, canonical_dtype, canonical_op
from traceana.ingest.dispatch import IngestOptions

_STEP = r"^ProfilerStep#(\d+)$"
_HOST_COMM = r"^(c10d::|record_param_comms|nccl:|gloo:)"


def cpu_frames(con: duckdb.DuckDBPyConnection, file_rank: pl.DataFrame, groups: pl.DataFrame,
               options: IngestOptions) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(device_events, collectives, steps) of a CPU-only run; frames carry ``f`` (file index)."""
    con.register("file_rank", file_rank.to_arrow())
    con.register("groups", groups.select("pg", "ranks").to_arrow())
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE main_thread AS
        SELECT f, arg_max(tid, n) AS tid FROM (
            SELECT f, tid, count(*) + 1000000 * count(*) FILTER (WHERE regexp_matches(name, '{_STEP}')) AS n
            FROM ev WHERE cat IN ('cpu_op', 'user_annotation') GROUP BY ALL
        ) GROUP BY f""")
    compute = con.sql(f"""
        WITH ops AS (
            SELECT e.f, CAST(e.tid AS BIGINT) AS stream, e.start_ns, e.end_ns, e.name,
                   max(e.end_ns) OVER (PARTITION BY e.f ORDER BY e.start_ns, e.end_ns DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until
            FROM ev e JOIN main_thread m USING (f, tid) WHERE e.cat = 'cpu_op'
        )
        SELECT f, stream, start_ns, end_ns, name, 'compute' AS category FROM ops
        WHERE (covered_until IS NULL OR start_ns >= covered_until) AND NOT regexp_matches(name, '{_HOST_COMM}')
    """).pl()
    comm = con.sql("""
        SELECT e.f, CAST(e.tid AS BIGINT) AS stream, e.start_ns, e.end_ns, e.name, 'comm' AS category,
               list_reduce(TRY_CAST(e.input_dims->0 AS BIGINT[]), lambda x, y: x * y, 1) AS nelems,
               e.input_type->>0 AS dtype_name, e.peer
        FROM ev e WHERE e.cat IN ('user_annotation', 'cpu_op') AND starts_with(e.name, 'gloo:')
    """).pl()
    comm = comm.with_columns(
        pl.col("name").map_elements(canonical_op, return_dtype=pl.String()).fill_null("Unknown").alias("op"),
        pl.col("dtype_name").map_elements(canonical_dtype, return_dtype=pl.String()).alias("dtype"),
    )
    events = pl.concat([compute, comm.select(compute.columns)]).sort("f", "start_ns", "end_ns", "name")
    events = events.with_columns(pl.int_range(pl.len()).over("f").cast(pl.Int64).alias("event_id"))
    comm = comm.join(events.select("f", "stream", "start_ns", "name", "event_id"),
                     on=["f", "stream", "start_ns", "name"])
    comm = comm.with_columns(
        (pl.col("nelems") * pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
        .alias("bytes"),
        pl.col("op").alias("kernel_op"),
    )
    comm = _infer_groups(con, comm.join(file_rank, on="f"))
    steps = con.sql(f"""
        SELECT e.f, CAST(regexp_extract(e.name, '{_STEP}', 1) AS INTEGER) AS step, e.start_ns, e.end_ns
        FROM ev e JOIN main_thread m USING (f, tid) WHERE regexp_matches(e.name, '{_STEP}')
        ORDER BY e.f, step""").pl()
    return events, comm, steps


def _infer_groups(con: duckdb.DuckDBPyConnection, comm: pl.DataFrame) -> pl.DataFrame:
    """Give each gloo op its group (and peer for Send/Recv) by the timing rule in the module docstring."""
    con.register("gloo_ops", comm.select("rank", "stream", "event_id", "op", "nelems", "start_ns", "end_ns",
                                         "peer").to_arrow())
    scored = con.sql("""
        WITH cand AS (  -- every group of a rank is a candidate for each of its worker threads
            SELECT DISTINCT o.rank, o.stream, g.pg, g.ranks
            FROM gloo_ops o JOIN groups g ON list_contains(g.ranks, o.rank)
        ), partner AS (  -- for each op and candidate group: members that have a matching, overlapping op
            SELECT o.rank, o.stream, o.event_id, c.pg, len(c.ranks) AS size, o.op,
                   p.rank AS member, min(abs(p.end_ns - o.end_ns)) AS gap_ns
            FROM gloo_ops o JOIN cand c ON c.rank = o.rank AND c.stream = o.stream
            JOIN gloo_ops p ON list_contains(c.ranks, p.rank) AND p.rank <> o.rank
                 AND p.nelems IS NOT DISTINCT FROM o.nelems
                 AND p.op = CASE o.op WHEN 'Send' THEN 'Recv' WHEN 'Recv' THEN 'Send' ELSE o.op END
                 AND p.start_ns <= o.end_ns AND o.start_ns <= p.end_ns
            GROUP BY ALL
        ), per_op AS (
            SELECT rank, stream, event_id, pg, op, size, count(*) AS members, sum(gap_ns) AS gap_ns,
                   arg_min(member, gap_ns) AS peer
            FROM partner GROUP BY ALL
        ), ok AS (
            SELECT *, CASE WHEN op IN ('Send', 'Recv') THEN members >= 1 ELSE members = size - 1 END AS matched
            FROM per_op
        ), score AS (
            SELECT rank, stream, pg, count(*) FILTER (WHERE matched) AS hits, sum(gap_ns) FILTER (WHERE matched) AS gap
            FROM ok GROUP BY ALL
        ), thread_pg AS (
            SELECT rank, stream, arg_max(pg, hits * 1e15 - coalesce(gap, 0)) AS pg FROM score WHERE hits > 0
            GROUP BY ALL
        )
        SELECT t.rank, t.stream, t.pg, o.event_id,
               CASE WHEN o.op IN ('Send', 'Recv') THEN CAST(o.peer AS INTEGER) END AS inferred_peer
        FROM thread_pg t LEFT JOIN ok o ON o.rank = t.rank AND o.stream = t.stream AND o.pg = t.pg AND o.matched
    """).pl()
    thread_pg = scored.select("rank", "stream", "pg").unique()
    peers = scored.select("rank", "event_id", "inferred_peer").drop_nulls("event_id")
    return comm.join(thread_pg, on=["rank", "stream"], how="left").join(
        peers, on=["rank", "event_id"], how="left").with_columns(
        pl.coalesce("peer", "inferred_peer").alias("peer"),
        pl.lit("timing-match").alias("evidence"),
        pl.lit(None, dtype=pl.Int64).alias("seq"),
    )
