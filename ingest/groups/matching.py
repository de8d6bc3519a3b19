"""Which process group each communicator of each rank served, from the timing of its collectives across ranks.

A communicator is where one rank runs one group's collectives in order: a gloo worker thread, a CUDA stream of
ProcessGroupNCCL (one per group and device), an nsys kernel stream. A collective cannot end on one member before
it has started on every other member. So for each communicator and each candidate group of its rank, count the
communicator's collectives whose partners (same op and size) overlap them in time on every other member; the group
with the most such collectives wins, closest end times breaking ties. Size never decides alone: where groups tie on
timing (TP and DP all-reducing 1 MiB at the same moment), every member of a group must run the same collectives
(op and size, as many of each), so a choice that leaves one member of a group short is not taken
(:func:`_members_agree`). Candidates are the trace's own groups
(pg_config) when it lists them, else every group the layout generates: the winner's rank set is then recovered
from the matching alone. The same function serves gloo threads, CUDA streams and nsys streams.
"""

from __future__ import annotations

import itertools
from collections import Counter

import duckdb
import polars as pl

_SEARCH_LIMIT = 200_000  # assignments the members check may visit before it keeps the timing's choice


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
    first = _score(partners, None)
    assignment = _pick(first)
    for _ in range(8):  # a partner counts only if its own communicator serves the same group: iterate to a fixed point
        refined = _pick(_score(partners, assignment))
        if refined.sort("rank", "stream").equals(assignment.sort("rank", "stream")):
            break
        assignment = refined
    return _members_agree(ops, candidates, first, assignment)


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


Signature = Counter[tuple[str, int | None]]


def _members_agree(ops: pl.DataFrame, candidates: pl.DataFrame, first: pl.DataFrame,
                   assignment: pl.DataFrame) -> pl.DataFrame:
    """The assignment, unless it leaves a group whose members ran different collectives: then the assignment that
    agrees, among those timing cannot tell from it, with the most hits and closest end times.

    One instance of a collective runs on every member of its group, so over the same window each member of a group
    runs the same collectives, as many of each (op and size; all-to-all by op, its splits vary). Timing ties where
    groups run same-size collectives at the same moment: TP [0, 1] and [2, 3] and DP [0, 2] and [1, 3] all-reducing
    1 MiB together overlap on every pair of ranks, and end-time closeness, on an oversubscribed CPU, may favour the
    wrong pair on ranks 0 and 2 alone (one TP thread each to DP: TP then has 1 call a step on rank 0 and 2 on rank 1).
    Each communicator may take any group with as many first-pass hits as its best (the timing tie), ranks keep
    torch's creation order along their thread ids, and the search keeps the best-valued assignment in which every
    group's members agree. A group some of whose members ran no collectives here is not checked (a rank not
    ingested); with no agreeing assignment, or too many to search, the timing's choice stands."""
    signature: dict[tuple[int, int], Signature] = {}
    size = pl.when(pl.col("op").eq_missing("AllToAll")).then(None).otherwise(pl.col("bytes")).alias("size")
    counted = ops.select("rank", "stream", "op", size).group_by("rank", "stream", "op", "size").len()  # per kind
    for rank, stream, op, size, n in counted.iter_rows():
        signature.setdefault((rank, stream), Counter())[op, size] += n
    chosen = {(rank, stream): pg for rank, stream, pg in assignment.iter_rows()}
    present = {rank for rank, _ in chosen}
    checked = {pg: tuple(ranks) for pg, ranks in candidates.select("pg", "ranks").iter_rows()
               if set(ranks) <= present}
    if _disagreeing(chosen, signature, checked) == set():
        return assignment
    value: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}  # (hits, value as _pick weighs it)
    for rank, stream, pg, hits, gap in first.select("rank", "stream", "pg", "hits", "gap").iter_rows():
        value.setdefault((rank, stream), {})[pg] = (hits, hits * 1e12 - (gap or 0))
    options = {rank: _rank_options(rank, [s for r, s in sorted(chosen) if r == rank], value, chosen)
               for rank in sorted({r for r, _ in chosen})}
    best = _search(options, signature, checked)
    if best is None:
        return assignment
    return pl.DataFrame([(r, s, g) for (r, s), g in sorted(best.items())],
                        schema={"rank": pl.Int32(), "stream": pl.Int64(), "pg": pl.String()}, orient="row")


def _disagreeing(chosen: dict[tuple[int, int], str], signature: dict[tuple[int, int], Signature],
                 checked: dict[str, tuple[int, ...]], ranks: set[int] | None = None) -> set[str]:
    """Checked groups (all members among ``ranks``, when given) whose members ran different collectives."""
    runs: dict[tuple[str, int], Signature] = {}
    for (rank, stream), pg in chosen.items():
        runs.setdefault((pg, rank), Counter()).update(signature.get((rank, stream), Counter()))
    bad = set()
    for pg, group in checked.items():
        if ranks is not None and not set(group) <= ranks:
            continue
        seen = [runs.get((pg, rank), Counter()) for rank in group]
        if any(s != seen[0] for s in seen[1:]):
            bad.add(pg)
    return bad


def _rank_options(rank: int, streams: list[int], value: dict[tuple[int, int], dict[str, tuple[float, float]]],
                  chosen: dict[tuple[int, int], str]) -> list[tuple[float, dict[tuple[int, int], str]]]:
    """One rank's possible assignments, best first: each communicator takes its chosen group or another with as many
    first-pass hits as its best, in creation order along the thread ids (as :func:`_pick` keeps it)."""
    per_stream = []
    for stream in streams:
        scores = value.get((rank, stream), {})
        top = max((hits for hits, _ in scores.values()), default=0)
        allowed = {g for g, (hits, _) in scores.items() if hits == top} | {chosen[rank, stream]}
        per_stream.append(sorted(allowed))
    found = []
    for groups in itertools.product(*per_stream):
        orders = [_creation_order(g) for g in groups]
        if any(b < a for a, b in itertools.pairwise(orders)):
            continue
        total = sum(value.get((rank, s), {}).get(g, (0, -1e18))[1] for s, g in zip(streams, groups, strict=True))
        found.append((total, {(rank, s): g for s, g in zip(streams, groups, strict=True)}))
        if len(found) > _SEARCH_LIMIT:
            return found[:0]  # too many to weigh: the caller keeps the timing's choice
    return sorted(found, key=lambda item: -item[0])


def _search(options: dict[int, list[tuple[float, dict[tuple[int, int], str]]]],
            signature: dict[tuple[int, int], Signature],
            checked: dict[str, tuple[int, ...]]) -> dict[tuple[int, int], str] | None:
    """The best-valued combination of the ranks' options in which every checked group's members agree
    (branch and bound over ranks; a group is checked as soon as all its members are placed)."""
    ranks = sorted(options)
    if any(not options[r] for r in ranks):
        return None
    bound = [0.0] * (len(ranks) + 1)  # the best the remaining ranks could add
    for i in range(len(ranks) - 1, -1, -1):
        bound[i] = bound[i + 1] + options[ranks[i]][0][0]
    best: list = [float("-inf"), None]
    visited = 0

    def place(i: int, total: float, chosen: dict[tuple[int, int], str]) -> None:
        nonlocal visited
        if i == len(ranks):
            if total > best[0]:
                best[:] = [total, dict(chosen)]
            return
        for option_value, option in options[ranks[i]]:
            visited += 1
            if visited > _SEARCH_LIMIT or total + option_value + bound[i + 1] <= best[0]:
                return
            trial = chosen | option
            if _disagreeing(trial, signature, checked, set(ranks[: i + 1])):
                continue
            place(i + 1, total + option_value, trial)

    place(0, 0.0, {})
    return best[1] if visited <= _SEARCH_LIMIT else None
