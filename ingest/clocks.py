"""One timeline per run: the cross-rank clock steps every format shares, after the format's coarse reference.

Per host, the ends of collectives and matched Send/Recv pairs that hosts share give pairwise offsets, chained onto
rank 0's host by weighted least squares (:func:`align_hosts`); per rank, ranks whose ends agree with another rank's
to a constant are shifted onto it (:func:`align_ranks`). Each shift goes into ``ranks.clock_offset_ns`` and the notes.
Inputs that never overlap in time are another job's (:func:`require_overlapping_clocks`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.run_data import SPILLED, TIME_COLUMNS, RunData


def instance_ends(data: RunData) -> pl.DataFrame:
    """(rank, instance, end_ns) of every collective instance and every matched Send/Recv pair (number_instances
    gives a Send and its Recv one instance): the events whose ends are simultaneous across ranks.

    A collective ends on all its members together (each waits for the last), while starts differ by arrival. NCCL
    documents ncclSend and ncclRecv as blocking for the GPU until the peer's matching call: the receiver's kernel
    ends when the data has arrived, the sender's when it has been taken, so a matched pair ends together within link
    latency and one chunk (the synthesizer writes both ends at the same instant). A small message sent before its
    receiver is ready can end early on the sender; the median over many pairs absorbs it while such pairs are a
    minority, and per rank the spread rule of :func:`align_ranks` drops a pair of ranks whose ends disagree.
    Send/Recv without a known peer are not paired and not used."""
    ops = data.table("collectives").filter(
        pl.col("instance").is_not_null() & (~pl.col("op").is_in(["Send", "Recv"]) | pl.col("peer").is_not_null()))
    return (ops.join(data.device_times().select("rank", "event_id", "end_ns"), on=["rank", "event_id"])
            .group_by("rank", "instance").agg(pl.col("end_ns").max()))


def align_hosts(data: RunData) -> None:
    """Shift each host's clock onto the first host's (rank 0's) by the ends of the collectives and Send/Recv pairs
    that hosts share (:func:`instance_ends`). Ranks of one host share a clock: one offset per host.

    Per instance, each member host's mean end is compared with the instance's first host (in rank order); per pair
    of hosts, the median of those differences over their shared instances is their offset. Chained from the
    reference host, the pair offsets give each host's: the least-squares solution weighted by the number of shared
    instances, over every host linked to the reference through any chain of pairs, so hosts that meet rank 0's only
    through other hosts or pipeline transfers are aligned too. Hosts not linked keep the format's coarse offset,
    and the notes name them. The shift is added to the times and to ``ranks.clock_offset_ns``."""
    ranks = data.table("ranks")
    if ranks["host"].drop_nulls().n_unique() < 2:
        return
    order = (ranks.filter(pl.col("host").is_not_null()).group_by("host").agg(pl.col("rank").min().alias("first"))
             .sort("first").with_row_index("node").select("host", pl.col("node").cast(pl.Int64)))
    ends = (instance_ends(data).join(ranks.select("rank", "host"), on="rank").join(order, on="host")
            .with_columns(pl.col("end_ns") - pl.col("end_ns").min())  # float64 would lose ns at epoch times
            .group_by("node", "instance").agg(pl.col("end_ns").mean())
            .with_columns(pl.col("node").min().over("instance").alias("anchor")))
    pairs = (ends.join(ends.select("instance", pl.col("node").alias("anchor"), pl.col("end_ns").alias("anchor_end")),
                       on=["instance", "anchor"]).filter(pl.col("node") != pl.col("anchor"))
             .group_by("anchor", "node").agg((pl.col("anchor_end") - pl.col("end_ns")).median().alias("offset"),
                                             pl.len().alias("n")))
    offsets = chain_offsets(pairs)
    hosts = order["host"].to_list()
    shift = ranks.select("rank", "host").join(
        pl.DataFrame({"host": [hosts[i] for i in offsets], "shift": list(offsets.values())},
                     schema={"host": pl.String(), "shift": pl.Int64()}), on="host").select("rank", "shift")
    if len(offsets) > 1:
        data.notes.append(f"hosts aligned onto {hosts[0]}'s clock by collective and send/recv end times "
                          f"({pairs.height} host pairs, least squares): " + ", ".join(
                              f"{hosts[i]} {s / 1e3:+.1f} us" for i, s in sorted(offsets.items())[1:]))
    if apart := [h for i, h in enumerate(hosts) if i not in offsets]:
        data.notes.append(f"host(s) {', '.join(apart)} share no collective or send/recv, directly or through other "
                          f"hosts, with {hosts[0]}: they keep the format's coarse clock offset")
    _shift_ranks(data, shift)


def chain_offsets(pairs: pl.DataFrame) -> dict[int, int]:
    """Offsets x of nodes (x[0] = 0) that best satisfy x[node] - x[anchor] = offset for each pair
    (anchor, node, offset, n), least squares weighted by n; only nodes linked to node 0 through pairs get one."""
    import numpy as np

    linked, frontier = {0}, {0}
    edges = pairs.select("anchor", "node").rows()
    while frontier:
        frontier = {b for a, b in edges if a in frontier} | {a for a, b in edges if b in frontier}
        frontier -= linked
        linked |= frontier
    pairs = pairs.filter(pl.col("anchor").is_in(list(linked)) & pl.col("node").is_in(list(linked)))
    index = {node: i for i, node in enumerate(sorted(linked - {0}))}
    if not index:
        return {0: 0}
    weight = np.sqrt(pairs["n"].to_numpy().astype(float))
    matrix = np.zeros((pairs.height, len(index)))
    rows = np.arange(pairs.height)
    for column, sign in (("node", 1.0), ("anchor", -1.0)):
        nodes_of = pairs[column].to_numpy()
        known = nodes_of != 0  # node 0's offset is fixed at 0: no column
        matrix[rows[known], [index[n] for n in nodes_of[known]]] = sign
    solution = np.linalg.lstsq(matrix * weight[:, None], pairs["offset"].to_numpy() * weight, rcond=None)[0]
    return {0: 0} | {node: round(float(solution[i])) for node, i in index.items()}


# Device collectives and matched Send/Recv pairs end on all members within link latency. A rank whose end differences
# from another rank's, over at least MIN_SHARED_ENDS shared instances, span no more than END_SPREAD_NS keeps a clock of
# its own that differs by a constant; wider spreads (CPU collectives: a gloo rank's part ends when its own thread hands
# off) are left alone.
END_SPREAD_NS = 20_000
MIN_SHARED_ENDS = 3


def align_ranks(data: RunData) -> None:
    """Per-rank clock alignment after :func:`align_hosts`: ranks of one host can still disagree (each device keeps
    its own clock). Each instance of :func:`instance_ends` (a collective or a Send/Recv pair) has its lowest member
    as anchor; per rank, the differences (anchor's end - this rank's end) over the instances they share. Where the
    rule above holds, the rank is shifted by the middle of their range (which minimizes the worst disagreement of
    ends) plus its anchor's own shift, in rank order, so ranks chain onto the lowest rank's clock. The notes say which
    ranks were aligned this way and which were not."""
    ends = instance_ends(data).with_columns(pl.col("rank").min().over("instance").alias("anchor"))
    diff = pl.col("anchor_end") - pl.col("end_ns")
    pairs = (ends.join(ends.select("instance", pl.col("rank").alias("anchor"), pl.col("end_ns").alias("anchor_end")),
                       on=["instance", "anchor"]).filter(pl.col("rank") != pl.col("anchor"))
             .group_by("rank", "anchor").agg(pl.len().alias("n"), diff.min().alias("lo"), diff.max().alias("hi"))
             .sort("rank", "n", "anchor", descending=[False, True, False]))
    consistent = pairs.filter((pl.col("n") >= MIN_SHARED_ENDS) & (pl.col("hi") - pl.col("lo") <= END_SPREAD_NS))
    shifts: dict[int, int] = {}
    for rank, anchor, _, lo, hi in consistent.unique("rank", keep="first", maintain_order=True).rows():
        shifts[rank] = shifts.get(anchor, 0) + round((lo + hi) / 2)
    if shifts:
        data.notes.append(f"rank clocks aligned by collective ends onto rank {min(ends['rank'])}'s: " + ", ".join(
            f"rank {r} {s / 1e3:+.1f} us" for r, s in sorted(shifts.items())[:16])
            + (f" and {len(shifts) - 16} more" if len(shifts) > 16 else ""))
    if left := sorted(set(pairs["rank"]) - set(shifts)):
        listing = ", ".join(map(str, left[:16])) + (f" and {len(left) - 16} more" if len(left) > 16 else "")
        data.notes.append(f"rank(s) {listing} keep their host's clock: their collective and send/recv ends do not "
                          f"agree with another rank's within {END_SPREAD_NS // 1000} us over {MIN_SHARED_ENDS} or more "
                          "instances (CPU collectives and sends do not end together; nor do instances matched wrongly)")
    _shift_ranks(data, pl.DataFrame({"rank": list(shifts), "shift": list(shifts.values())},
                                    schema={"rank": pl.Int32(), "shift": pl.Int64()}))


def _shift_ranks(data: RunData, shift: pl.DataFrame) -> None:
    """Add ``shift`` (rank, shift ns) to every time of those ranks and to their ``clock_offset_ns``: in the frames
    held here, and for spilled tables in the parts' shift, which the store adds as it reads them."""
    if shift.is_empty() or shift["shift"].abs().max() == 0:
        return

    def shifted(frame: pl.DataFrame, columns: tuple[str, ...]) -> pl.DataFrame:
        return frame.join(shift, on="rank", how="left").with_columns(
            [pl.col(c) + pl.col("shift").fill_null(0) for c in columns]).drop("shift")

    for table, columns in TIME_COLUMNS.items():
        if data.spill is None or table not in SPILLED:
            frame = data.table(table)
            if not frame.is_empty():
                data.frames[table] = shifted(frame, columns)
    if data.comm_events is not None:
        data.comm_events = shifted(data.comm_events, ("start_ns", "end_ns"))
    if data.spill is not None:
        data.spill.parts = data.spill.parts.join(shift, on="rank", how="left", suffix="_by").select(
            "key", "rank", pl.col("shift") + pl.col("shift_by").fill_null(0))
    data.frames["ranks"] = data.table("ranks").join(shift, on="rank", how="left").with_columns(
        (pl.col("clock_offset_ns").fill_null(0) + pl.col("shift").fill_null(0)).alias("clock_offset_ns")
    ).drop("shift")


def require_overlapping_clocks(spans: list[tuple[str, int, int]]) -> None:
    """Inputs (source, first ns, last ns) of one run were recorded together: their time spans chain into one.
    Where they fall apart into groups that never overlap, the files are from different jobs (or recordings): a
    one-line error naming the first file of the smallest group."""
    groups: list[list[tuple[str, int, int]]] = []
    for span in sorted(spans, key=lambda s: s[1]):
        if groups and span[1] <= max(s[2] for s in groups[-1]):
            groups[-1].append(span)
        else:
            groups.append([span])
    if len(groups) > 1:
        odd = min(reversed(groups), key=len)[0]
        other = next(g for g in groups if odd not in g)[0]
        raise TraceanaError(f"{odd[0]}: recorded at times that never overlap those of {Path(other[0]).name} "
                            "(another job or recording); ingest each as its own run")
