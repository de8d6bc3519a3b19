"""CPU-only PyTorch profiler runs (gloo): the process is the device.

Compute is the main thread's outermost *operator* calls: dispatcher ops named ``namespace::op`` (aten::mm,
a custom library's op), nested ones folded into their parent so nothing counts twice. Python-level ranges are
not compute because they can hold a blocking wait: a custom autograd Function whose forward all-reduces, or an
``autograd::engine::evaluate_function: ...`` node, spans the whole collective, and counting it would hide that wait
as compute. Leaf ops alone would lose work too (aten::mm has a sub-microsecond aten::resolve_conj child). The
host side of communication (``c10d::*``) and autograd bookkeeping are not compute; time between operators
(Python and dispatcher overhead) is host time, IDLE. Communication is the ``gloo:*`` ranges that gloo's worker
threads record. Those ranges carry op and shape but no process group, so the group is inferred:

- collectives (evidence ``timing-match``): every gloo worker thread serves one group, and a collective cannot end
  on one member before it has started on every other member. For each worker thread and each candidate group of its
  rank, count the thread's ops whose partners (same op and size) overlap them on all other members; the group with
  the most such ops wins, closest end times breaking ties;
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
from traceana.ingest.kineto import FIRST_INPUT_NELEMS

_STEP = r"^ProfilerStep#(\d+)$"
_NOT_COMPUTE = r"^(c10d::|autograd::|torch::autograd::|profiler::)"  # operator-named, but waits or bookkeeping


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
    comm = pl.concat([_collective_groups(con, comm.filter(~is_p2p)), _p2p_groups(con, comm.filter(is_p2p))],
                     how="diagonal_relaxed")
    steps = con.sql(f"""
        SELECT e.f, TRY_CAST(regexp_extract(e.name, '{_STEP}', 1) AS INTEGER) AS step, e.start_ns, e.end_ns
        FROM ev e JOIN main_thread m USING (f, tid) WHERE regexp_matches(e.name, '{_STEP}')
        ORDER BY e.f, step""").pl()
    return events, comm, steps


def _collective_groups(con: duckdb.DuckDBPyConnection, comm: pl.DataFrame) -> pl.DataFrame:
    """Give each gloo collective its group by the worker-thread timing rule in the module docstring."""
    con.register("gloo_ops", comm.select("rank", "stream", "event_id", "op", "nelems", "start_ns", "end_ns",
                                         "peer").to_arrow())
    partners = con.sql("""
        WITH members AS (  -- (group, member rank) pairs, so partners are found by equality, not by list scans
            SELECT pg, len(ranks) AS size, unnest(ranks) AS member FROM groups
        ), cand AS (  -- every group of a rank is a candidate for each of its worker threads
            SELECT DISTINCT o.rank, o.stream, m.pg, m.size FROM gloo_ops o JOIN members m ON m.member = o.rank
        )  -- for each op and candidate group: ops of other members that match it and overlap it in time
        SELECT o.rank, o.stream, o.event_id, c.pg, c.size, p.rank AS member, p.stream AS member_stream,
               CAST(min(abs(p.end_ns - o.end_ns)) AS DOUBLE) AS gap
        FROM gloo_ops o JOIN cand c ON c.rank = o.rank AND c.stream = o.stream
        JOIN members m ON m.pg = c.pg AND m.member <> o.rank
        JOIN gloo_ops p ON p.rank = m.member AND p.op = o.op
             AND (p.nelems IS NOT DISTINCT FROM o.nelems OR o.op = 'AllToAll')  -- a2a splits vary
             AND p.start_ns <= o.end_ns AND o.start_ns <= p.end_ns
        GROUP BY ALL
    """).pl()
    assignment = _pick_thread_groups(_score(partners, None))
    for _ in range(8):  # a partner counts only if its own thread serves the same group: iterate to a fixed point
        refined = _pick_thread_groups(_score(partners, assignment))
        if refined.sort("rank", "stream").equals(assignment.sort("rank", "stream")):
            break
        assignment = refined
    return comm.join(assignment, on=["rank", "stream"], how="left").with_columns(
        pl.lit("timing-match").alias("evidence"), pl.lit(None, dtype=pl.Int64).alias("seq"))


def _score(partners: pl.DataFrame, assignment: pl.DataFrame | None) -> pl.DataFrame:
    """(rank, stream, pg, hits, gap): ops of the thread matched on every other member of pg, and their end gaps.

    Given the current assignment, an op whose partners all sit on threads assigned the same group counts 1, one
    matched only through threads assigned elsewhere counts 0.1: consistent evidence outweighs coincidence.
    """
    if assignment is None:
        partners = partners.with_columns(consistent=pl.lit(True))
    else:
        partners = partners.join(
            assignment.rename({"rank": "member", "stream": "member_stream", "pg": "member_pg"}),
            on=["member", "member_stream"], how="left").with_columns(consistent=pl.col("member_pg") == pl.col("pg"))
    per_op = partners.group_by("rank", "stream", "event_id", "pg", "size").agg(
        pl.col("member").n_unique().alias("members"),
        pl.col("member").filter(pl.col("consistent")).n_unique().alias("consistent"),
        pl.col("gap").min().over("member").sum().alias("gap"))
    matched = per_op.filter(pl.col("members") == pl.col("size") - 1).with_columns(
        pl.when(pl.col("consistent") == pl.col("members")).then(1.0).otherwise(0.1).alias("weight"))
    return matched.group_by("rank", "stream", "pg").agg(pl.col("weight").sum().alias("hits"), pl.col("gap").sum())


def _pick_thread_groups(score: pl.DataFrame) -> pl.DataFrame:
    """(rank, stream, pg): each worker thread's group, by timing hits under the creation-order constraint.

    Timing alone is ambiguous when two groups run same-size collectives at once (and on an oversubscribed CPU the
    true partner can end milliseconds later). Creation order is not: torch names groups "0", "1", ... as it creates
    them and gloo starts a group's worker threads inside that call, so along a rank's thread ids the groups' names
    never decrease. Each rank's threads therefore get the non-decreasing assignment with the most hits (closest end
    times breaking ties): a small dynamic programme over threads x candidate groups, not a loop over events.
    """
    def order(pg: str) -> int:
        head = pg.split("/")[0]
        return int(head) if head.isdigit() else 1 << 30

    picks = []
    for (rank,), rows in score.group_by(["rank"], maintain_order=True):
        threads = sorted(set(rows["stream"].to_list()))
        groups = sorted(set(rows["pg"].to_list()), key=order)
        value = {(t, g): h * 1e12 - (gap or 0) for t, g, h, gap in rows.select("stream", "pg", "hits", "gap")
                 .iter_rows()}
        # best[j] = (total, assignment) for the threads so far with the last thread in group j or earlier
        best: list[tuple[float, list[str]]] = [(0.0, [])] * len(groups)
        for thread in threads:
            row, running = [], (float("-inf"), [])
            for j, group in enumerate(groups):
                if best[j][0] > running[0]:
                    running = best[j]
                row.append((running[0] + value.get((thread, group), -1e18), [*running[1], group]))
            best = [max(row[: j + 1], key=lambda item: item[0]) for j in range(len(groups))]
        picks += [(rank, t, g) for t, g in zip(threads, best[-1][1], strict=True)]
    return pl.DataFrame(picks, schema={"rank": pl.Int32(), "stream": pl.Int64(), "pg": pl.String()}, orient="row")


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
