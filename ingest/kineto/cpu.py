"""CPU-only PyTorch profiler runs (gloo): the process is the device.

Compute is the main thread's outermost *operator* calls: dispatcher ops named ``namespace::op`` (aten::mm,
a custom library's op), nested ones folded into their parent so nothing counts twice. Python-level ranges are
not compute because they can hold a blocking wait: a custom autograd Function whose forward all-reduces, or an
``autograd::engine::evaluate_function: ...`` node, spans the whole collective, and counting it would hide that wait
as compute. Leaf ops alone would lose work too (aten::mm has a sub-microsecond aten::resolve_conj child). The
host side of communication (``c10d::*``) and autograd bookkeeping are not compute; time between operators
(Python and dispatcher overhead) is host time, IDLE. Communication is the ``gloo:*`` ranges that gloo's worker
threads record. Those ranges carry op and shape but no process group, so the group is inferred:

- collectives (evidence ``timing-match``): every gloo worker thread serves one group; which one is found by
  :mod:`traceana.ingest.groups.matching`, the matching every format shares (candidates: pg_config's groups);
- point-to-point (evidence ``cpu-op``): send/recv run on the calling thread, right after the ``c10d::send`` /
  ``c10d::recv_`` op whose third concrete input is the peer's rank *within the group*. A Send from a to group-rank k
  of group G is real only if G[k] has a Recv from a's own group-rank with the same size; the group where most of a
  rank's sends and receives pair up that way wins, and G[k] is the peer.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.ingest.comm_names import DTYPE_BYTES, canonical_dtype, canonical_op
from traceana.ingest.dispatch import IngestOptions
from traceana.ingest.groups.matching import match_communicators
from traceana.ingest.kineto.events import FIRST_INPUT_NELEMS, STEP

_NOT_COMPUTE = r"^(c10d::|autograd::|torch::autograd::|profiler::)"  # operator-named, but waits or bookkeeping


def cpu_frames(con: duckdb.DuckDBPyConnection, file_rank: pl.DataFrame, groups: pl.DataFrame,
               options: IngestOptions) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(device_events, collectives, steps) of a CPU-only run; frames carry ``f`` (file index)."""
    con.register("file_rank", file_rank.to_arrow())
    con.register("groups", groups.select("pg", "ranks").to_arrow())
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE main_thread AS
        SELECT f, arg_max(tid, n) AS tid FROM (
            SELECT f, tid, count(*) + 1000000 * count(*) FILTER (WHERE regexp_matches(name, '{STEP}')) AS n
            FROM ev WHERE cat IN ('cpu_op', 'user_annotation') GROUP BY ALL
        ) GROUP BY f""")
    compute = con.sql(f"""
        WITH ops AS (
            SELECT e.f, CAST(e.tid AS BIGINT) AS stream, e.start_ns, e.end_ns, e.name,
                   max(e.end_ns) OVER (PARTITION BY e.f ORDER BY e.start_ns, e.end_ns DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_until
            FROM ev e JOIN main_thread m USING (f, tid)
            WHERE e.cat = 'cpu_op' AND regexp_matches(e.name, '^[A-Za-z_][A-Za-z0-9_]*::')
              AND NOT regexp_matches(e.name, '{_NOT_COMPUTE}')
        )
        SELECT f, stream, start_ns, end_ns, name, 'compute' AS category FROM ops
        WHERE covered_until IS NULL OR start_ns >= covered_until
    """).pl()
    # The logical op is what the program called (the c10d op issued on the main thread just before the gloo range
    # starts); the range's own name is what gloo ran: reduce_scatter runs as gloo:all_reduce.
    comm = con.sql(f"""
        WITH calls AS (
            SELECT e.f, e.start_ns, e.name FROM ev e JOIN main_thread USING (f, tid)
            WHERE starts_with(e.name, 'c10d::') AND NOT regexp_matches(e.name, 'send|recv')
        )
        SELECT e.f, CAST(e.tid AS BIGINT) AS stream, e.start_ns, e.end_ns, e.name, 'comm' AS category,
               {FIRST_INPUT_NELEMS} AS nelems,
               e.input_type->>0 AS dtype_name, e.peer, c.name AS call
        FROM ev e ASOF LEFT JOIN calls c ON c.f = e.f AND e.start_ns >= c.start_ns
        WHERE e.cat IN ('user_annotation', 'cpu_op') AND starts_with(e.name, 'gloo:')
    """).pl()
    kernel_op = pl.col("name").map_elements(canonical_op, return_dtype=pl.String()).fill_null("Unknown")
    call_op = pl.col("call").map_elements(canonical_op, return_dtype=pl.String())
    comm = comm.with_columns(
        kernel_op.alias("kernel_op"),
        pl.when(kernel_op.is_in(["Send", "Recv"])).then(kernel_op).otherwise(pl.coalesce(call_op, kernel_op))
        .alias("op"),
        pl.col("dtype_name").map_elements(canonical_dtype, return_dtype=pl.String()).alias("dtype"),
    )
    events = pl.concat([compute, comm.select(compute.columns)]).sort("f", "start_ns", "end_ns", "name")
    events = events.with_columns(pl.int_range(pl.len()).over("f").cast(pl.Int64).alias("event_id"))
    comm = comm.join(events.select("f", "stream", "start_ns", "name", "event_id"),
                     on=["f", "stream", "start_ns", "name"])
    comm = comm.with_columns(
        (pl.col("nelems") * pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
        .alias("bytes"),
    )
    comm = comm.join(file_rank, on="f")
    is_p2p = pl.col("op").is_in(["Send", "Recv"])
    comm = pl.concat([_collective_groups(comm.filter(~is_p2p), groups), _p2p_groups(con, comm.filter(is_p2p))],
                     how="diagonal_relaxed")
    steps = con.sql(f"""
        SELECT e.f, TRY_CAST(regexp_extract(e.name, '{STEP}', 1) AS INTEGER) AS step, e.start_ns, e.end_ns
        FROM ev e JOIN main_thread m USING (f, tid) WHERE regexp_matches(e.name, '{STEP}')
        ORDER BY e.f, step""").pl()
    return events, comm, steps


def _collective_groups(comm: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """Give each gloo collective its group: the group its worker thread serves (groups.matching, by timing)."""
    assignment = match_communicators(comm, groups.filter(pl.col("ranks").list.len() > 1))
    return comm.join(assignment, on=["rank", "stream"], how="left").with_columns(
        pl.lit("timing-match").alias("evidence"), pl.lit(None, dtype=pl.Int64).alias("seq"))


def _p2p_groups(con: duckdb.DuckDBPyConnection, p2p: pl.DataFrame) -> pl.DataFrame:
    """Give each gloo send/recv its group and peer by the group-rank rule in the module docstring."""
    con.register("p2p_ranges", p2p.select("f", "rank", "stream", "event_id", "op", "nelems", "start_ns").to_arrow())
    resolved = con.sql("""
        WITH calls AS (  -- the c10d op that issued each range: k-th call <-> k-th range, per thread and direction
            SELECT f, CAST(tid AS BIGINT) AS stream, TRY_CAST(concrete->>2 AS INTEGER) AS group_peer,
                   starts_with(name, 'c10d::send') AS is_send,
                   row_number() OVER (PARTITION BY f, tid, starts_with(name, 'c10d::send') ORDER BY start_ns) AS k
            FROM ev WHERE name IN ('c10d::send', 'c10d::recv_')
        ), ops AS (
            SELECT r.*, c.group_peer FROM (
                SELECT *, row_number() OVER (PARTITION BY f, stream, op ORDER BY start_ns) AS k FROM p2p_ranges
            ) r LEFT JOIN calls c ON c.f = r.f AND c.stream = r.stream AND c.is_send = (r.op = 'Send') AND c.k = r.k
        ), cand AS (  -- each op under each group of its rank that has that group-rank
            SELECT o.rank, o.event_id, o.op, o.nelems, g.pg, len(g.ranks) AS size, g.ranks[o.group_peer + 1] AS peer,
                   list_position(g.ranks, o.rank) - 1 AS own
            FROM ops o JOIN groups g ON list_contains(g.ranks, o.rank) AND o.group_peer < len(g.ranks)
            WHERE o.group_peer IS NOT NULL AND g.ranks[o.group_peer + 1] <> o.rank
        ), paired AS (
            SELECT c.*, EXISTS (
                SELECT 1 FROM ops p WHERE p.rank = c.peer AND p.group_peer = c.own AND p.nelems = c.nelems
                AND p.op = CASE c.op WHEN 'Send' THEN 'Recv' ELSE 'Send' END) AS ok
            FROM cand c
        ), best AS (
            SELECT rank, arg_max(pg, n * 1000000 - size) AS pg FROM (  -- ties: the smallest (most specific) group
                SELECT rank, pg, count(*) FILTER (WHERE ok) AS n, max(size) AS size FROM paired GROUP BY ALL
            ) WHERE n > 0 GROUP BY rank
        )
        SELECT p.rank, p.event_id, p.pg, CAST(p.peer AS INTEGER) AS inferred_peer
        FROM paired p JOIN best b ON b.rank = p.rank AND b.pg = p.pg
    """).pl()
    return p2p.join(resolved, on=["rank", "event_id"], how="left").with_columns(
        pl.coalesce("peer", "inferred_peer").alias("peer"), pl.lit("cpu-op").alias("evidence"),
        pl.lit(None, dtype=pl.Int64).alias("seq")).drop("inferred_peer")
