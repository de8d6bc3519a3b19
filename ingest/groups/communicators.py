"""Process groups the trace does not name, found from where and how each rank ran its collectives.

A communicator is one rank's ordered channel for one group: ProcessGroupNCCL runs each group's collectives on its
own CUDA stream per device, gloo on the group's own worker threads, HCCL under its communicator name. So the
collectives of one (rank, stream) share one group. Evidence, strongest first; a weaker one never overrides a
stronger one (a collective that already has a group keeps it):

1. ``pg-args`` / ``cpu-op`` / ``comm-name``: the trace names the group (kernel or CPU-op args, pg_config, HCCL);
   ``op-only``: a CPU op names the operation but no group (a later route may still find it).
2. ``stream``: a communicator where some collectives name their group lends that group to the others.
3. ``timing-match``: with several ranks and a layout, each remaining communicator is matched across ranks against
   every group the layout generates (:mod:`traceana.ingest.groups.matching`); the winning rank set gives the dim.
4. ``fingerprint``: with a layout, what one communicator runs picks its group among the layout's groups of its
   rank (:data:`FINGERPRINTS`), narrowed by the group size the trace states or implies when it does.

A group whose rank set several dims share (EP and DP over the same ranks) gives each op the dim its op implies
(:data:`OP_DIM`): all-to-all is expert traffic, reductions and gathers gradient and parameter sync. A communicator
none of these resolves keeps no group (pg NULL, dim UNKNOWN); one note says how much that is and what would help.
"""

from __future__ import annotations

import polars as pl

from traceana.ingest.groups.matching import match_communicators
from traceana.layout import GROUP_PRIORITY, Layout, dim_from_name

P2P = ("Send", "Recv", "SendRecv")
_REDUCTIONS = frozenset({"AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce"})

# What a communicator runs -> the group kinds it can serve (seed 002): EP dispatches and combines tokens with
# all-to-all (twice per MoE layer); PP sends activations and gradients between stage neighbours; TP/CP all-reduce,
# reduce-scatter and all-gather activations, DP/FSDP parameter buckets. The first rule whose ops the communicator
# runs applies; kinds whose size is 1 in the layout drop out; a stated group size (kernel args, or the in/out shape
# ratio of reduce-scatter and all-gather) keeps only groups of that size. One rank set left: that is the group.
FINGERPRINTS: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    ("all-to-all", frozenset({"AllToAll"}), ("EP",)),
    ("point-to-point only", frozenset(P2P), ("PP",)),
    ("reductions and gathers", _REDUCTIONS, ("TP", "CP", "DP")),
)

# Equal rank sets: the dim an op means when its group's ranks are the group of several dims. All-to-all is EP's own
# op; reductions and gathers on ranks EP shares with DP are gradient and parameter sync. Ops the trace does not
# identify (a bare SendRecv kernel) keep the group's dim.
OP_DIM = {"AllToAll": "EP", "Send": "PP", "Recv": "PP", **dict.fromkeys(_REDUCTIONS, "DP")}

_GROUP_SCHEMA = {"pg": pl.String(), "dim": pl.String(), "ranks": pl.List(pl.Int32()), "name": pl.String(),
                 "source": pl.String()}


def attribute(coll: pl.DataFrame, events: pl.DataFrame, groups: pl.DataFrame, layout: Layout | None,
              world_size: int, source_format: str) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """(collectives, process_groups, notes): every collective's group and dim by the strongest evidence at hand.

    ``coll`` has pg and dim (from the trace's groups) and may carry ``group_size``; ``events`` holds the device
    events (rank, event_id, stream, start_ns, end_ns); ``source_format`` decides which advice the notes give."""
    if coll.is_empty():
        return coll, groups.with_columns(pl.lit(None, pl.String()).alias("streams")), []
    if "group_size" not in coll.columns:
        coll = coll.with_columns(pl.lit(None, pl.Int64()).alias("group_size"))
    work = coll.with_row_index("_row").join(
        events.select("rank", "event_id", "stream", "start_ns", "end_ns"), on=["rank", "event_id"], how="left")
    work = _from_stream(work)
    new_groups = []
    if layout is not None:
        candidates = _layout_groups(layout, world_size)
        work, matched = _from_matching(work, candidates, world_size)
        work, fingerprinted = _from_fingerprints(work, layout, candidates, groups)
        new_groups = [matched, fingerprinted.filter(~pl.col("pg").is_in(matched["pg"].to_list()))]
    groups = pl.concat([groups.select(list(_GROUP_SCHEMA)).cast(_GROUP_SCHEMA),  # type: ignore[arg-type]
                        *new_groups], how="vertical")
    work = _pair_peers(_op_dims(work, groups, layout), groups)
    groups = groups.join(_streams(work), on="pg", how="left")
    out = work.sort("_row").select(coll.columns)
    return out, groups, _unknown_note(work, groups, layout, world_size, source_format)


def _from_stream(work: pl.DataFrame) -> pl.DataFrame:
    """A (rank, stream) whose named collectives all name one group lends it to its unnamed ones."""
    named = work.filter(pl.col("pg").is_not_null()).group_by("rank", "stream").agg(pl.col("pg").unique())
    lend = named.filter(pl.col("pg").list.len() == 1).select(
        "rank", "stream", pl.col("pg").list.first().alias("_spg"))
    return _adopt(work.join(lend, on=["rank", "stream"], how="left"), "_spg", "stream")


def _adopt(work: pl.DataFrame, column: str, evidence: str, only: pl.Expr | None = None) -> pl.DataFrame:
    """Collectives without a group yet (and ``only`` those) take the one in ``column``, recorded as ``evidence``;
    one that has a group keeps it, so weaker evidence never overrides stronger. ``column`` is dropped."""
    take = pl.col("pg").is_null() & pl.col(column).is_not_null()
    take = take if only is None else take & only
    return work.with_columns(
        pl.when(take).then(pl.col(column)).otherwise(pl.col("pg")).alias("pg"),
        pl.when(take).then(pl.lit(evidence)).otherwise(pl.col("evidence")).alias("evidence"),
    ).drop(column)


def _layout_groups(layout: Layout, world_size: int) -> pl.DataFrame:
    """pg, dim, ranks of every distinct rank set (two or more ranks) the layout generates, plus the world."""
    seen: dict[tuple[int, ...], str] = {}
    for kind in GROUP_PRIORITY:  # a rank set several kinds share is named after the one its dim is
        for index, ranks in enumerate(layout.groups[kind]):
            if len(ranks) > 1:
                seen.setdefault(tuple(ranks), f"{kind}:{index}")
    seen.setdefault(tuple(range(world_size)), "world")
    return pl.DataFrame(
        [{"pg": pg, "dim": layout.dim_of(ranks)[0], "ranks": list(ranks)} for ranks, pg in seen.items()],
        schema={"pg": pl.String(), "dim": pl.String(), "ranks": pl.List(pl.Int32())})


def _from_matching(work: pl.DataFrame, candidates: pl.DataFrame,
                   world_size: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Unnamed communicators matched across ranks against the layout's groups (timing-match).

    Only with every rank ingested: two ranks of a larger job run the same collectives at the same time (they share
    its DP or world group), so with the others missing any small group of theirs would match just as well."""
    todo = work.filter(pl.col("pg").is_null() & ~pl.col("op").is_in(P2P) & pl.col("stream").is_not_null())
    empty = pl.DataFrame(schema=_GROUP_SCHEMA)
    if todo.is_empty() or work["rank"].n_unique() < max(world_size, 2):
        return work, empty
    found = match_communicators(todo, candidates).rename({"pg": "_mpg"})
    if found.is_empty():
        return work, empty
    work = _adopt(work.join(found, on=["rank", "stream"], how="left"), "_mpg", "timing-match",
                  ~pl.col("op").is_in(P2P))
    used = candidates.filter(pl.col("pg").is_in(found["_mpg"].unique().to_list()))
    return work, used.with_columns(pl.lit(None, pl.String()).alias("name"), pl.lit("timing-match").alias("source"))


def _fingerprint(layout: Layout, rank: int, ops: set[str], sizes: set[int], alone: bool,
                 taken: set[tuple[int, ...]]) -> list[int] | None:
    """The rank set one communicator serves by :data:`FINGERPRINTS`, or None when no rule names exactly one.

    ``alone``: the trace states a group of this rank alone (pg_config), which a communicator of reductions may
    serve as well: then the sets another of the rank's communicators already matched in time (``taken``) are not
    this one's, and what is left decides (a tp=4 job's one-rank DP all-reduces are not TP's)."""
    for _rule, trigger, kinds in FINGERPRINTS:
        if not ops & trigger or (trigger == frozenset(P2P) and not ops <= trigger):
            continue
        sets = {tuple(g) for kind in kinds for g in layout.groups[kind] if rank in g and len(g) > 1}
        if alone and trigger == _REDUCTIONS:
            sets = (sets | {(rank,)}) - taken
        if len(sizes) == 1:
            sets = {s for s in sets if len(s) in sizes}
        return list(sets.pop()) if len(sets) == 1 else None
    return None


def _from_fingerprints(work: pl.DataFrame, layout: Layout, candidates: pl.DataFrame,
                       stated: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Unnamed, unmatched communicators given the layout group that what they run implies (fingerprint), or the
    group of their rank alone that the trace states (``stated``: pg_config's groups)."""
    pg_of = {tuple(r): pg for pg, r in candidates.select("pg", "ranks").iter_rows()}
    alone = {r[0]: pg for pg, r in stated.select("pg", "ranks").iter_rows() if r is not None and len(r) == 1}
    pg_of |= {(rank,): pg for rank, pg in alone.items()}
    ranks_of = {pg: tuple(r) for pg, r in pl.concat([candidates.select("pg", "ranks"), stated.select("pg", "ranks")
                                                     .cast({"ranks": pl.List(pl.Int32())})]).iter_rows() if r}
    taken: dict[int, set[tuple[int, ...]]] = {}
    for rank, pg in work.filter(pl.col("evidence") == "timing-match").select("rank", "pg").unique().iter_rows():
        if pg in ranks_of:
            taken.setdefault(rank, set()).add(ranks_of[pg])
    todo = work.filter(pl.col("pg").is_null() & pl.col("stream").is_not_null()).group_by("rank", "stream").agg(
        pl.col("op").unique().alias("ops"), pl.col("group_size").drop_nulls().unique().alias("sizes"))
    rows = []
    for rank, stream, ops, sizes in todo.iter_rows():
        ranks = _fingerprint(layout, rank, set(ops), set(sizes), rank in alone, taken.get(rank, set()))
        if ranks is not None:
            rows.append({"rank": rank, "stream": stream, "_fpg": pg_of[tuple(ranks)], "ranks": ranks})
    if not rows:
        return work, pl.DataFrame(schema=_GROUP_SCHEMA)
    found = pl.DataFrame(rows, schema={"rank": pl.Int32(), "stream": pl.Int64(), "_fpg": pl.String(),
                                       "ranks": pl.List(pl.Int32())})
    work = _adopt(work.join(found.select("rank", "stream", "_fpg"), on=["rank", "stream"], how="left"), "_fpg",
                  "fingerprint")
    groups = candidates.filter(pl.col("pg").is_in(found["_fpg"].to_list())).with_columns(
        pl.lit(None, pl.String()).alias("name"), pl.lit("fingerprint").alias("source"))
    return work, groups.select(list(_GROUP_SCHEMA))


def _op_dims(work: pl.DataFrame, groups: pl.DataFrame, layout: Layout | None) -> pl.DataFrame:
    """Each collective's dim: its group's; where the group's rank set is several dims' and no name says which,
    the one its op implies (OP_DIM), evidence fingerprint when that differs from the group's."""
    def kinds(ranks: list[int], name: str | None) -> list[str]:
        if layout is None or dim_from_name(name) or len(ranks) < 2:
            return []
        return layout.dims_of(ranks)

    shared = groups.select("pg", pl.col("dim").alias("_gdim"), pl.Series(
        "_kinds", [kinds(r, n) for r, n in zip(groups["ranks"].to_list(), groups["name"].to_list(), strict=True)],
        dtype=pl.List(pl.String())))
    work = work.join(shared, on="pg", how="left")
    implied = pl.col("op").replace_strict(OP_DIM, default=None, return_dtype=pl.String())
    by_op = pl.when(pl.col("_kinds").list.contains(implied)).then(implied).otherwise(pl.col("_gdim"))
    unset = pl.col("dim").is_null() | (pl.col("dim") == "UNKNOWN")
    dim = pl.when(unset).then(pl.coalesce(by_op, pl.lit("UNKNOWN"))).otherwise(pl.col("dim"))
    refine = pl.col("_kinds").list.contains(implied) & (implied != pl.col("_gdim"))
    return work.with_columns(
        pl.when(refine).then(implied).otherwise(dim).alias("dim"),
        pl.when(refine).then(pl.lit("fingerprint")).otherwise(pl.col("evidence")).alias("evidence"),
    ).drop("_gdim", "_kinds")


def _pair_peers(work: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """A Send or Recv without a stated peer, in a group of two ranks: the peer is the other one."""
    pairs = groups.filter(pl.col("ranks").list.len() == 2).select("pg", pl.col("ranks").alias("_pair"))
    work = work.join(pairs, on="pg", how="left")
    other = pl.when(pl.col("_pair").list.first() == pl.col("rank")).then(pl.col("_pair").list.last()).otherwise(
        pl.col("_pair").list.first())
    guess = pl.when(pl.col("op").is_in(["Send", "Recv"]) & pl.col("_pair").is_not_null()).then(other)
    return work.with_columns(pl.coalesce("peer", guess).cast(pl.Int32).alias("peer")).drop("_pair")


def _streams(work: pl.DataFrame) -> pl.DataFrame:
    """pg -> 'rank:stream ...': where each group's collectives ran (CUDA/Ascend stream, gloo worker thread)."""
    pairs = work.filter(pl.col("stream").is_not_null()).select("pg", "rank", "stream").unique().sort(
        "pg", "rank", "stream")
    return pairs.group_by("pg", maintain_order=True).agg(
        pl.format("{}:{}", "rank", "stream").str.join(" ").alias("streams"))


def _unknown_note(work: pl.DataFrame, groups: pl.DataFrame, layout: Layout | None, world_size: int,
                  source_format: str) -> list[str]:
    """One note: how many collectives, and what share of communication time, have no dim, and why: their groups
    hold one rank each (nothing to tell apart), or the trace states no groups, or too few ranks / no layout."""
    busy = (pl.col("end_ns") - pl.col("start_ns")).fill_null(0)
    unknown = work.filter(pl.col("dim") == "UNKNOWN")
    if unknown.is_empty():
        return []
    total = work.select(busy.sum()).item() or 0
    share = unknown.select(busy.sum()).item() / total if total else 0.0
    head = f"{unknown.height} of {work.height} collectives ({share:.0%} of communication time) have no dim: "
    members = unknown.join(groups.select("pg", pl.col("ranks").list.len().alias("_members")), on="pg", how="left")
    alone = not groups.is_empty() and groups["ranks"].list.len().eq(1).all()  # every group the trace states
    if members["_members"].eq(1).fill_null(alone).all():
        return [head + "their groups hold one rank each (the trace's process groups), so no other rank takes part"]
    ingested = work["rank"].n_unique()
    helps = []
    if layout is None:
        helps.append("pass --layout")
    if ingested < world_size:
        helps.append(f"ingest all {world_size} ranks (this run has {ingested})")
    if source_format == "kineto" and groups.is_empty():  # only torch.profiler writes pg_config
        helps.append("record with a PyTorch that writes pg_config and Process Group args (2.2 or newer): this "
                     "trace states no process groups")
    if source_format == "rocprofv3":
        helps.append("rocprofv3 records no process groups")
    if layout is not None and ingested == world_size:
        helps.append("check that --layout is the job's (no layout group matched these communicators)")
    return [head + "; or ".join(helps)]


def group_dims(groups: pl.DataFrame, layout: Layout | None) -> pl.DataFrame:
    """Fill each group's missing dim: from its rank set against the layout (name breaks ties), else its name."""
    known = groups["dim"].to_list() if "dim" in groups.columns else [None] * groups.height
    dims = [
        dim if dim and dim != "UNKNOWN"
        else layout.dim_of(ranks, name)[0] if layout is not None
        else dim_from_name(name) or "UNKNOWN"
        for ranks, name, dim in zip(groups["ranks"].to_list(), groups["name"].to_list(), known, strict=True)
    ]
    return groups.with_columns(pl.Series("dim", dims, dtype=pl.String()))
