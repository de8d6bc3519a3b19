"""Which process group each communicator of each rank served, from the timing of its collectives across ranks.

A communicator is where one rank runs one group's collectives in order: a gloo worker thread, a CUDA stream of
ProcessGroupNCCL (one per group and device), an nsys kernel stream. A collective cannot end on one member before
it has started on every other member. So for each communicator and each candidate group of its rank, count the
communicator's collectives whose partners (same op and size) overlap them in time on every other member; the group
with the most such collectives wins, closest end times breaking ties. Candidates are the trace's own groups
(pg_config) when it lists them, else every group the layout generates: the winner's rank set is then recovered
from the matching alone. The same function serves gloo threads, CUDA streams and nsys streams.
"""

from __future__ import annotations

import duckdb
import polars as pl


def match_communicators(ops: pl.DataFrame, candidates: pl.DataFrame) -> pl.DataFrame:
    """(rank, stream, pg): the group each communicator served, for those with at least one fully matched op.

    ``ops``: rank, stream, event_id, op, bytes, start_ns, end_ns (collectives only, on one clock);
    ``candidates``: pg, ranks (groups of two or more ranks)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32(), "stream": pl.Int64(), "pg": pl.String()})
    if ops.is_empty() or candidates.is_empty():
        return empty
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    con.register("ops", ops.select("rank", "stream", "event_id", "op", "bytes", "start_ns", "end_ns").to_arrow())
    con.register("groups", candidates.select("pg", "ranks").to_arrow())
    partners = con.sql("""
        WITH members AS (  -- (group, member rank) pairs, so partners are found by equality, not by list scans
            SELECT pg, len(ranks) AS size, unnest(ranks) AS member FROM groups
        ), cand AS (  -- every group of a rank is a candidate for each of its communicators
            SELECT DISTINCT o.rank, o.stream, m.pg, m.size FROM ops o JOIN members m ON m.member = o.rank
        )  -- for each op and candidate group: ops of other members that match it and overlap it in time
        SELECT o.rank, o.stream, o.event_id, c.pg, c.size, p.rank AS member, p.stream AS member_stream,
               CAST(min(abs(p.end_ns - o.end_ns)) AS DOUBLE) AS gap
        FROM ops o JOIN cand c ON c.rank = o.rank AND c.stream = o.stream
        JOIN members m ON m.pg = c.pg AND m.member <> o.rank
        JOIN ops p ON p.rank = m.member AND p.op = o.op
             AND (p.bytes IS NOT DISTINCT FROM o.bytes OR o.op = 'AllToAll')  -- a2a splits vary
             AND p.start_ns <= o.end_ns AND o.start_ns <= p.end_ns
        GROUP BY ALL
    """).pl()
    con.close()
    if partners.is_empty():
        return empty
    assignment = _pick(_score(partners, None))
    for _ in range(8):  # a partner counts only if its own communicator serves the same group: iterate to a fixed point
        refined = _pick(_score(partners, assignment))
        if refined.sort("rank", "stream").equals(assignment.sort("rank", "stream")):
            break
        assignment = refined
    return assignment


def _score(partners: pl.DataFrame, assignment: pl.DataFrame | None) -> pl.DataFrame:
    """(rank, stream, pg, hits, gap): ops of the communicator matched on every other member of pg, their end gaps.

    Given the current assignment, an op whose partners all sit on communicators assigned the same group counts 1,
    one matched only through communicators assigned elsewhere counts 0.1: consistent evidence outweighs coincidence.
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


def _creation_order(pg: str) -> int:
    """torch names groups "0", "1", ... as it creates them; other names (layout groups) carry no order."""
    head = pg.split("/")[0]
    return int(head) if head.isdigit() else 1 << 30


def _pick(score: pl.DataFrame) -> pl.DataFrame:
    """(rank, stream, pg): each communicator's group, by timing hits under the creation-order constraint.

    Timing alone is ambiguous when two groups run same-size collectives at once (and on an oversubscribed CPU the
    true partner can end milliseconds later). Creation order is not: gloo starts a group's worker threads inside
    the call that creates it, so along a rank's thread ids torch's group names never decrease. Each rank's
    communicators therefore get the non-decreasing assignment with the most hits (closest end times breaking ties):
    a small dynamic programme over communicators x creation-order levels, not a loop over events. Groups without a
    creation order (the layout's) share one level, where each communicator simply takes its best group.
    """
    picks = []
    for (rank,), rows in score.group_by(["rank"], maintain_order=True):
        streams = sorted(set(rows["stream"].to_list()))
        levels = sorted({_creation_order(g) for g in rows["pg"].to_list()})
        value = {(s, g): h * 1e12 - (gap or 0) for s, g, h, gap in rows.select("stream", "pg", "hits", "gap")
                 .iter_rows()}
        by_level: dict[int, list[str]] = {}
        for group in sorted(set(rows["pg"].to_list())):
            by_level.setdefault(_creation_order(group), []).append(group)
        # best[j] = (total, assignment) for the communicators so far, the last one's group at level j or lower
        best: list[tuple[float, list[str]]] = [(0.0, [])] * len(levels)
        for stream in streams:
            row, running = [], (float("-inf"), [])
            for j, level in enumerate(levels):
                if best[j][0] > running[0]:
                    running = best[j]
                group = max(by_level[level], key=lambda g, s=stream: value.get((s, g), -1e18))
                row.append((running[0] + value.get((stream, group), -1e18), [*running[1], group]))
            best = [max(row[: j + 1], key=lambda item: item[0]) for j in range(len(levels))]
        picks += [(rank, s, g) for s, g in zip(streams, best[-1][1], strict=True)]
    return pl.DataFrame(picks, schema={"rank": pl.Int32(), "stream": pl.Int64(), "pg": pl.String()}, orient="row")
