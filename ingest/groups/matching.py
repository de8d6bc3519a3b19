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
import tempfile
from collections import Counter

import duckdb
import polars as pl

_MEMORY = "512MiB"  # DuckDB's cap while matching: beyond it the tables spill to a temporary folder
_SEARCH_LIMIT = 200_000  # assignments the members check may visit before it keeps the timing's choice


def match_communicators(ops: pl.DataFrame, candidates: pl.DataFrame) -> pl.DataFrame:
    """(rank, stream, pg): the group each communicator served, for those with at least one fully matched op.

    ``ops``: rank, stream, event_id, op, bytes, start_ns, end_ns (collectives only, on one clock);
    ``candidates``: pg, ranks (groups of two or more ranks)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32(), "stream": pl.Int64(), "pg": pl.String()})
    if ops.is_empty() or candidates.is_empty():
        return empty
    with tempfile.TemporaryDirectory(prefix="traceana-match-") as spill, duckdb.connect(
            config={"threads": 2, "memory_limit": _MEMORY, "temp_directory": spill}) as con:
        _prepare(con, ops, candidates)
        first = _score(con, None)
        if first.is_empty():
            return empty
        assignment = _pick(first)
        for _ in range(8):  # a partner counts only if its own communicator serves the same group: to a fixed point
            refined = _pick(_score(con, assignment))
            if refined.sort("rank", "stream").equals(assignment.sort("rank", "stream")):
                break
            assignment = refined
    return _members_agree(ops, candidates, first, assignment)


# Partners: for an op and a candidate group of its rank, the ops of the group's other members that match it (same
# op and size; all-to-all by op, its splits vary) and overlap it in time. Listing them for every member grows with
# ops x group size (a world group of N ranks: N - 1 rows an op; 20 GiB at 1,024 ranks of 60 collectives a step), so
# the ops of one kind are first cut into *bursts*: runs of overlapping ops (a new burst where an op starts after
# every earlier one ended), outside which an op has no partner. A *clean* burst, one op per rank and every op
# overlapping every other (the usual: one instance of a collective on every member), needs no list: its partners
# in a group are the group's other ops in the burst, counted per (burst, group) with window functions. Only the ops
# of other bursts are joined pairwise, within their burst, one row per member communicator with the closest end.
_PREPARE_SQL = ("""
CREATE TEMP TABLE members AS  -- (group, member rank) pairs, so partners are found by equality, not by list scans
    SELECT pg, len(ranks) AS size, unnest(ranks) AS member FROM groups""", """
CREATE TEMP TABLE bursts AS
    WITH keyed AS (
        SELECT *, CASE WHEN op <> 'AllToAll' THEN bytes END AS size_key FROM ops
    ), reach AS (  -- the latest end of the kind's earlier ops
        SELECT *, max(end_ns) OVER (PARTITION BY op, size_key ORDER BY start_ns, end_ns, rank, stream, event_id
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM keyed
    ), numbered AS (
        SELECT *, sum(CASE WHEN reach IS NULL OR start_ns > reach THEN 1 ELSE 0 END)
                  OVER (PARTITION BY op, size_key ORDER BY start_ns, end_ns, rank, stream, event_id
                        ROWS UNBOUNDED PRECEDING) AS burst FROM reach
    )
    SELECT rank, stream, event_id, op, size_key, burst, start_ns, end_ns,
           max(start_ns) OVER b <= min(end_ns) OVER b AND count(*) OVER b = count(DISTINCT rank) OVER b AS clean,
           end_ns - min(end_ns) OVER b AS end_rel  -- small, so that sums of ends fit
    FROM numbered WINDOW b AS (PARTITION BY op, size_key, burst)""", """
CREATE TEMP TABLE clean AS  -- every op of a clean burst once per candidate group of its rank
    SELECT b.rank, b.stream, b.event_id, b.op, b.size_key, b.burst, b.end_rel, m.pg, m.size
    FROM bursts b JOIN members m ON m.member = b.rank WHERE b.clean""", """
CREATE TEMP TABLE partners AS  -- the other bursts' ops: each member communicator's closest matching op
    WITH other AS (SELECT * FROM bursts WHERE NOT clean)
    SELECT o.rank, o.stream, o.event_id, m.pg, m.size, p.rank AS member, p.stream AS member_stream,
           min(abs(p.end_ns - o.end_ns)) AS gap
    FROM other o JOIN members c ON c.member = o.rank
    JOIN members m ON m.pg = c.pg AND m.member <> o.rank
    JOIN other p ON p.rank = m.member AND p.op = o.op AND p.size_key IS NOT DISTINCT FROM o.size_key
         AND p.burst = o.burst AND p.start_ns <= o.end_ns AND o.start_ns <= p.end_ns
    GROUP BY ALL""")


def _prepare(con: duckdb.DuckDBPyConnection, ops: pl.DataFrame, candidates: pl.DataFrame) -> None:
    """The tables :func:`_score` reads (members, bursts, clean, partners), in ``con``."""
    con.register("ops", ops.select("rank", "stream", "event_id", "op", "bytes", "start_ns", "end_ns").to_arrow())
    con.register("groups", candidates.select("pg", "ranks").to_arrow())
    for sql in _PREPARE_SQL:
        con.execute(sql)


def _score(con: duckdb.DuckDBPyConnection, assignment: pl.DataFrame | None) -> pl.DataFrame:
    """(rank, stream, pg, hits, gap): ops of the communicator matched on every other member of pg, and the sum of
    their partners' end gaps (ns; per member its closest, once per member communicator).

    Given the current assignment, an op whose partners all sit on communicators assigned the same group counts 1,
    one matched only through communicators assigned elsewhere counts 0.1: consistent evidence outweighs coincidence.
    Hits are counted in tenths, so that equal evidence gives equal hits whatever the order of the rows.
    """
    if assignment is None:
        mine, partner, join_clean, join_other = "false", "true", "", ""
    else:
        con.register("assigned", assignment.to_arrow())
        mine, partner = "coalesce(a.pg = c.pg, false)", "coalesce(a.pg = p.pg, false)"
        join_clean = "LEFT JOIN assigned a ON a.rank = c.rank AND a.stream = c.stream"
        join_other = "LEFT JOIN assigned a ON a.rank = p.member AND a.stream = p.member_stream"
    consistent = "members" if assignment is None else "sum(mine::INT) OVER g - mine::INT"
    return con.sql(f"""
        WITH flagged AS (SELECT c.*, {mine} AS mine FROM clean c {join_clean}
        ), clean_ops AS (  -- the group's other ops in the burst; their gaps as sums of ends below and above
            SELECT rank, stream, event_id, pg, size, members, {consistent} AS consistent,
                   (below * end_rel - (running - end_rel)) + ((total - running) - above * end_rel) AS gap
            FROM (SELECT *, count(*) OVER g - 1 AS members, count(*) OVER up_to - 1 AS below,
                         count(*) OVER g - count(*) OVER up_to AS above, sum(end_rel) OVER up_to AS running,
                         sum(end_rel) OVER g AS total
                  FROM flagged WINDOW g AS (PARTITION BY op, size_key, burst, pg),
                                      up_to AS (g ORDER BY end_rel, rank ROWS UNBOUNDED PRECEDING))
            WINDOW g AS (PARTITION BY op, size_key, burst, pg)
        ), per_member AS (
            SELECT p.rank, p.stream, p.event_id, p.pg, p.size, p.member, count(*) * min(p.gap) AS gap,
                   bool_or({partner}) AS consistent
            FROM partners p {join_other} GROUP BY ALL
        ), other_ops AS (
            SELECT rank, stream, event_id, pg, size, count(*) AS members, count(*) FILTER (consistent) AS consistent,
                   sum(gap) AS gap
            FROM per_member GROUP BY ALL
        ), per_op AS (SELECT * FROM clean_ops UNION ALL SELECT * FROM other_ops)
        SELECT rank, stream, pg,
               (10 * count(*) FILTER (consistent = members) + count(*) FILTER (consistent < members)) / 10 AS hits,
               CAST(sum(gap) AS DOUBLE) AS gap
        FROM per_op WHERE members = size - 1 GROUP BY ALL ORDER BY rank, stream, pg""").pl()


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
