"""What every ingester returns: one run's tables in the store schema (minus ``run_id``).

Ingesters only parse; :func:`finish` applies the steps every format shares (layout coordinates, group
dimensions, collective instance numbers) so that no ingester re-implements them.

The compact tables (ranks, groups, collectives, steps) are Polars frames. The bulky per-event tables may instead be
*spilled*: written as Parquet by the worker that parsed each file (:class:`Spill`), so that the run is never held in
memory; the cross-rank steps then work on the collectives' own event times (``RunData.comm_events``) and record
clock shifts per part, which the store adds as it streams the Parquet in.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.communicators import attribute
from traceana.layout import Layout, dim_from_name

if TYPE_CHECKING:
    from traceana.ingest.validate import Dropped

# Column name -> Polars dtype, per table, in store order (run_id is added by the store).
SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "ranks": {
        "rank": pl.Int32(), "host": pl.String(), "device": pl.Int32(), "pid": pl.Int64(),
        "clock_offset_ns": pl.Int64(), "tp": pl.Int32(), "cp": pl.Int32(), "ep": pl.Int32(), "dp": pl.Int32(),
        "pp": pl.Int32(), "rank_source": pl.String(), "source": pl.String(),
    },
    "process_groups": {
        "pg": pl.String(), "dim": pl.String(), "ranks": pl.List(pl.Int32()), "name": pl.String(),
        "source": pl.String(), "streams": pl.String(),
    },
    "device_events": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "stream": pl.Int64(), "start_ns": pl.Int64(),
        "end_ns": pl.Int64(), "name": pl.String(), "category": pl.String(), "launch_ns": pl.Int64(),
    },
    "collectives": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "op": pl.String(), "kernel_op": pl.String(),
        "bytes": pl.Int64(), "dtype": pl.String(), "pg": pl.String(), "dim": pl.String(), "seq": pl.Int64(),
        "instance": pl.Int64(), "peer": pl.Int32(), "evidence": pl.String(),
    },
    "annotations": {
        "rank": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(),
        "domain": pl.String(), "kind": pl.String(), "args": pl.String(),
    },
    "steps": {"rank": pl.Int32(), "step": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64()},
    "memory": {"rank": pl.Int32(), "ts_ns": pl.Int64(), "allocated_bytes": pl.Int64(), "reserved_bytes": pl.Int64()},
}
TABLES = tuple(SCHEMAS)
TIME_COLUMNS = {"device_events": ("start_ns", "end_ns", "launch_ns"), "annotations": ("start_ns", "end_ns"),
                "steps": ("start_ns", "end_ns"), "memory": ("ts_ns",)}
SPILLED = ("device_events", "annotations", "memory")  # the tables that grow with events: written per file


def conform(table: str, frame: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` with exactly the store columns of ``table`` (missing ones NULL, extra ones dropped), cast."""
    schema = SCHEMAS[table]
    if frame is None:
        return pl.DataFrame(schema=schema)
    return frame.select(
        [(pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )


class Spill:
    """A folder of Parquet parts, ``<folder>/<table>/<key>.parquet``, each one input file's rows of a
    :data:`SPILLED` table (store columns without ``rank``); ``parts`` (key, rank, shift) says whose rows each part
    holds and the ns to add to their times. The folder is removed by :meth:`remove`, or when the object goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.parts = pl.DataFrame(schema={"key": pl.String(), "rank": pl.Int32(), "shift": pl.Int64()})
        self._remove = weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)

    def remove(self) -> None:
        self._remove()

    def glob(self, table: str) -> str | None:
        """The Parquet files of ``table`` as a read_parquet pattern, or None when no part has rows of it."""
        return str(self.folder / table / "*.parquet") if any((self.folder / table).glob("*.parquet")) else None

    def select_sql(self, table: str, pattern: str) -> str:
        """SELECT of ``table``'s store columns (without run_id) from its Parquet, ranked and shifted by ``parts``
        (registered as ``spill_parts``)."""
        cols = ["p.rank" if c == "rank" else f"t.{c} + p.shift AS {c}" if c in TIME_COLUMNS[table] else f"t.{c}"
                for c in SCHEMAS[table]]
        pattern = pattern.replace("'", "''")
        return (f"SELECT {', '.join(cols)} FROM read_parquet('{pattern}', filename = true) t "
                "JOIN spill_parts p ON p.key = parse_filename(t.filename, true)")


def spill_part(folder: Path, table: str, key: str, frame: pl.DataFrame) -> None:
    """One file's rows of ``table`` (store columns; ``rank`` comes from the parts) as part ``key`` of a Spill."""
    if frame.is_empty():
        return
    (folder / table).mkdir(parents=True, exist_ok=True)
    conform(table, frame).drop("rank").write_parquet(folder / table / f"{key}.parquet", compression="lz4",
                                                     statistics=False)


def spill_folder(near: Path) -> Path:
    """A new empty folder for one ingest's Parquet parts next to ``near`` (the store), named after it."""
    near.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{near.name}.ingest-{os.getpid()}-", dir=near.parent))


@contextmanager
def new_spill(near: Path) -> Iterator[Spill]:
    """A :class:`Spill` for one ingest's parts, next to ``near`` (the store); removed if reading the run fails (on
    success the RunData carries it, and the store write or its caller removes it)."""
    spill = Spill(spill_folder(near))
    try:
        yield spill
    except BaseException:
        spill.remove()
        raise


@dataclass
class RunData:
    """One run, parsed. Frames may omit columns; :func:`conform` fills them when the store writes. With a
    :class:`Spill`, its tables are not in ``frames`` and ``comm_events`` holds the (rank, event_id, stream,
    start_ns, end_ns) of the collectives' device events, all the cross-rank steps read of them."""

    source_format: str
    sources: list[str]
    world_size: int
    tool_version: str | None = None
    rank_source: str | None = None
    notes: list[str] = field(default_factory=list)
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    layout: Layout | None = None  # the user's --layout, else one the trace states (MindSpeed distributed_args)
    spill: Spill | None = None
    comm_events: pl.DataFrame | None = None
    dropped: Dropped | None = None  # what validation left out of the rows spilled by the workers

    def table(self, name: str) -> pl.DataFrame:
        """The whole table as a frame (for a spilled one, read back from its Parquet in the order of its columns,
        whatever the parts' names: tests and small runs)."""
        if self.spill is not None and name in SPILLED:
            pattern = self.spill.glob(name)
            if pattern is None:
                return conform(name, None)
            import duckdb

            with duckdb.connect() as con:
                con.register("spill_parts", self.spill.parts.to_arrow())
                return conform(name, con.sql(f"{self.spill.select_sql(name, pattern)} ORDER BY ALL").pl())
        return conform(name, self.frames.get(name))

    def device_times(self) -> pl.DataFrame:
        """(rank, event_id, stream, start_ns, end_ns) of at least every collective's device event."""
        if self.comm_events is not None:
            return self.comm_events
        return self.table("device_events").select("rank", "event_id", "stream", "start_ns", "end_ns")

    def discard(self) -> None:
        """Remove the spilled Parquet (the run is in the store, or will never be)."""
        if self.spill is not None:
            self.spill.remove()


def finish(data: RunData, layout: Layout | None) -> RunData:
    """Coordinates, group dimensions, collective groups and dims (communicators.attribute), instance numbers: the
    steps every format shares.

    ``layout`` is the user's; without it, a layout the trace itself states is used."""
    layout = data.layout = layout or data.layout
    ranks = data.table("ranks").with_columns(pl.col("clock_offset_ns").fill_null(0))
    if layout is not None:
        layout.check_world_size(data.world_size, data.sources[0])
        coords = pl.DataFrame([{"rank": r, **layout.coords(r)} for r in ranks["rank"].to_list()],
                              schema={"rank": pl.Int32(), **{d: pl.Int32() for d in ("tp", "cp", "ep", "dp", "pp")}})
        ranks = ranks.drop("tp", "cp", "ep", "dp", "pp").join(coords, on="rank", how="left").select(ranks.columns)
    data.frames["ranks"] = ranks
    groups = group_dims(data.table("process_groups"), layout)
    coll = data.table("collectives")
    stated = data.frames.get("collectives")
    if stated is not None and "group_size" in stated.columns:  # kept for the fingerprints, not stored
        coll = coll.with_columns(stated["group_size"].cast(pl.Int64))
    coll, data.frames["process_groups"], notes = attribute(coll, data.device_times(), groups, layout,
                                                           data.world_size)
    data.frames["collectives"] = number_instances(coll)
    data.notes += notes
    align_hosts(data)
    align_ranks(data)
    return data


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


def number_instances(coll: pl.DataFrame, starts: pl.DataFrame | None = None) -> pl.DataFrame:
    """Give ``instance`` the same value on every rank of one collective.

    With a trace sequence number (``seq``) the key is (pg, seq). Without it, the k-th collective a rank issues
    in a group is the k-th of every member: key (pg, k). Point-to-point ops pair the k-th Send a->b with the k-th
    Recv at b from a: key (pg, src, dst, k). Order of issue is ``event_id`` order, which ingesters assign by
    start time per rank. Rows already carrying an instance keep it.
    """
    if coll.is_empty():
        return coll
    p2p = pl.col("op").is_in(["Send", "Recv"]) & pl.col("peer").is_not_null()
    src = pl.when(pl.col("op") == "Send").then(pl.col("rank")).otherwise(pl.col("peer"))
    dst = pl.when(pl.col("op") == "Send").then(pl.col("peer")).otherwise(pl.col("rank"))
    keyed = coll.with_row_index("_row").sort("rank", "event_id").with_columns(
        pl.when(p2p).then(src).otherwise(-1).alias("_src"),
        pl.when(p2p).then(dst).otherwise(-1).alias("_dst"),
        pl.coalesce("pg", pl.lit("?")).alias("_pg"),
    )
    keyed = keyed.with_columns(
        pl.when(pl.col("seq").is_not_null()).then(pl.col("seq"))
        .otherwise(pl.int_range(pl.len()).over("rank", "_pg", "_src", "_dst", pl.col("seq").is_null()))
        .alias("_k"),
        pl.col("seq").is_not_null().alias("_has_seq"),
    )
    ids = keyed.select("_pg", "_src", "_dst", "_has_seq", "_k").unique().sort(pl.all())
    ids = ids.with_row_index("_instance")
    out = keyed.join(ids, on=["_pg", "_src", "_dst", "_has_seq", "_k"], how="left")
    out = out.with_columns(pl.coalesce("instance", pl.col("_instance").cast(pl.Int64)).alias("instance"))
    return out.sort("_row").select(coll.columns)


def marker_steps(ranges: pl.DataFrame, marker: str) -> pl.DataFrame:
    """Steps from the ranges (NVTX, CPU ops) whose name matches ``marker``, per rank when ``ranges`` has one: a
    step is numbered by the last integer in its name, else by its order on the rank; ranges sharing a number form
    one step spanning them all. A rank without markers gets no rows (step_windows makes its activity one step)."""
    try:
        marked = ranges.filter(pl.col("name").str.contains(marker))
    except pl.exceptions.ComputeError as exc:
        raise TraceanaError(f"--step-marker {marker!r}: {str(exc).splitlines()[0]}") from None
    by = ["rank"] if "rank" in marked.columns else []
    marked = marked.sort([*by, "start_ns"]).with_columns(pl.coalesce(
        pl.col("name").str.extract(r"(\d+)\D*$").cast(pl.Int64),
        pl.int_range(pl.len()).over(by) if by else pl.int_range(pl.len())).alias("step"))
    return marked.group_by([*by, "step"]).agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort([*by, "step"])


# A rank in a file name only where the name says "rank": rank3, rank_3, _r3_, worker3 (tried in this order). Other
# digits (h200_gpt_h2048_L8_s1024_gb4, a timestamp, a pid) are not ranks.
_RANK_IN_NAME = (r"(?i)rank[_-]?(\d+)", r"(?i)(?:^|[_.-])r(\d+)(?=[_.-])", r"(?i)worker[_-]?(\d+)")


def rank_in_file_name(name: str) -> int | None:
    """The rank a file name states through an explicit pattern, else None."""
    for pattern in _RANK_IN_NAME:
        if found := re.search(pattern, name):
            return int(found[1])
    return None


def require_unique_ranks(ranks: list[int], sources: list[str]) -> None:
    """Two inputs claiming the same rank is a user error, named with both files."""
    seen: dict[int, str] = {}
    for rank, source in zip(ranks, sources, strict=True):
        if rank in seen:
            raise TraceanaError(f"{source}: rank {rank} is also claimed by {seen[rank]}")
        seen[rank] = source


_BEFORE, _AFTER = -(1 << 62), 1 << 62  # launched before the first / after the last step range: no step


def launch_steps(events: pl.DataFrame, markers: pl.DataFrame) -> pl.Series:
    """For each device event (rank, launch_ns), the step whose CPU range on its rank holds the launch: the latest
    step starting at or before it (a launch between two steps is the earlier one's); before the first step or
    after the last one's end, no step. NULL where the launch is unknown."""
    keyed = events.select("rank", "launch_ns").with_row_index("_row")
    marks = markers.select(pl.col("rank").cast(keyed.schema["rank"]), "step", "start_ns", "end_ns").sort("start_ns")
    bounds = marks.group_by("rank").agg(pl.col("start_ns").min().alias("_first"), pl.col("end_ns").max().alias("_last"))
    found = (keyed.filter(pl.col("launch_ns").is_not_null()).sort("launch_ns")
             .join_asof(marks.select("rank", "step", "start_ns"), left_on="launch_ns", right_on="start_ns", by="rank",
                        check_sortedness=False)
             .join(bounds, on="rank", how="left")
             .select("_row", pl.when(pl.col("launch_ns") < pl.col("_first")).then(pl.lit(_BEFORE))
                     .when(pl.col("launch_ns") >= pl.col("_last")).then(pl.lit(_AFTER))
                     .otherwise(pl.col("step")).cast(pl.Int64).alias("step")))
    return keyed.join(found, on="_row", how="left").sort("_row")["step"]


@dataclass
class StepLinks:
    """How :func:`step_windows_of` found steps, counted so that ranks windowed apart (in workers) give the notes of
    the whole run: whether some rank linked launches to steps, device events without a launch record, whether the
    format has device-side step ranges, and the ranks whose steps are their markers' CPU ranges."""

    linked: bool = False
    unlaunched: int = 0
    annotated: bool = False
    unlinked: list[int] = field(default_factory=list)

    def __add__(self, other: StepLinks) -> StepLinks:
        return StepLinks(self.linked or other.linked, self.unlaunched + other.unlaunched,
                         self.annotated or other.annotated, self.unlinked + other.unlinked)

    def notes(self) -> list[str]:
        out = []
        if self.linked:
            note = "step windows on the device: each event in the step that launched it (correlation id), cut " \
                   "where consecutive steps' work overlaps least"
            if self.unlaunched:
                by = "the profiler's device-side step ranges, else " if self.annotated else ""
                note += f"; {self.unlaunched} events without a launch record placed by {by}their stream's previous " \
                        "event"
            out.append(note)
        if self.unlinked:
            out.append(f"no launch records on rank(s) {', '.join(map(str, sorted(set(self.unlinked))))}: steps "
                       "there are the step markers' CPU ranges")
        return out


def step_windows_of(events: pl.DataFrame, markers: pl.DataFrame) -> tuple[pl.DataFrame, StepLinks]:
    """Steps of a GPU run: device windows (:func:`device_step_windows`) on every rank where some device event's
    launch (``launch_ns``, the runtime call's time; else the format's own device-side ``step``, if any) falls in a
    step marker's CPU range; the marker ranges themselves on ranks without such links."""
    annotated = events["step"] if "step" in events.columns else pl.Series("step", [None] * len(events), pl.Int64)
    if markers.is_empty() or events.is_empty():  # (run apart, a rank's events without markers have no step)
        return markers, StepLinks(unlaunched=events.height, annotated=annotated.is_not_null().any(),
                                  unlinked=markers["rank"].unique().to_list())
    launched = launch_steps(events, markers)
    events = events.with_columns(pl.coalesce(launched, annotated).alias("step"))
    linked = events.filter(~pl.col("step").is_in([_BEFORE, _AFTER]))["rank"].unique()
    windows = device_step_windows(events.filter(pl.col("rank").is_in(linked.implode())))
    rest = markers.filter(~pl.col("rank").is_in(linked.implode()))
    links = StepLinks(not linked.is_empty(), launched.null_count(), annotated.is_not_null().any(),
                      rest["rank"].unique().to_list())
    return pl.concat([windows, rest.select(windows.columns)], how="vertical_relaxed"), links


def device_step_windows(events: pl.DataFrame) -> pl.DataFrame:
    """Step windows on the device from device events (rank, stream, start_ns, end_ns, step) whose step is the one
    that launched them (NULL: unknown; launched outside every step: the sentinels of :func:`launch_steps`).

    An event without a known step takes the step of the event before it on its stream (a stream runs in issue
    order), or is earlier than every step when nothing precedes it. Each step's window ends where the next one's
    begins: where their work does not overlap, at the later step's first event; where it does (the next step's
    prefetch copies run under this step's compute), at the instant that leaves the least device time on the wrong
    side of the cut (time of this step's events after it plus time of the next step's events before it). The
    first step opens at its first event, or at its cut from the earlier work; the last closes at its last event's
    end, or at its cut from the later work. Windows are contiguous and never overlap."""
    events = events.filter(pl.col("end_ns") >= pl.col("start_ns")).sort("rank", "stream", "start_ns", "end_ns")
    events = events.with_columns(pl.col("step").forward_fill().over("rank", "stream").fill_null(_BEFORE))
    groups = (events.group_by("rank", "step").agg(pl.col("start_ns").min().alias("lo"),
                                                  pl.col("end_ns").max().alias("hi"))
              .sort("rank", "step").with_columns(pl.int_range(pl.len()).over("rank").alias("g")))
    # Pair g is the boundary between group g and group g + 1: their work overlaps on [lo of g+1, hi of g].
    pairs = groups.select("rank", "g", "hi", pl.col("lo").shift(-1).over("rank").alias("lo")).drop_nulls()
    events = events.join(groups.select("rank", "step", "g"), on=["rank", "step"])
    # Moving the cut past t changes the misplaced time at the rate (open events of g+1) - (open events of g).
    earlier = events.select("rank", "g", t=pl.concat_list("start_ns", "end_ns"), d=pl.lit([-1, 1]))
    later = events.select("rank", g=pl.col("g") - 1, t=pl.concat_list("start_ns", "end_ns"), d=pl.lit([1, -1]))
    zone = pairs.filter(pl.col("lo") < pl.col("hi"))
    points = (pl.concat([earlier, later]).explode("t", "d").join(zone, on=["rank", "g"])
              .filter(pl.col("t") <= pl.col("hi")).with_columns(pl.max_horizontal("t", "lo").alias("t")))
    points = pl.concat([points, zone.with_columns(t=pl.col("lo"), d=pl.lit(0, points.schema["d"]))],
                       how="diagonal_relaxed")
    cost = points.sort("rank", "g", "t").with_columns(
        (pl.col("d").cum_sum() * (pl.col("t").shift(-1) - pl.col("t")).fill_null(0)).over("rank", "g").alias("_c")
    ).with_columns((pl.col("_c").cum_sum() - pl.col("_c")).over("rank", "g").alias("cost"))
    best = cost.sort("rank", "g", "cost", "t").group_by("rank", "g").agg(pl.col("t").first().alias("cut"))
    cuts = pairs.join(best, on=["rank", "g"], how="left").select(
        "rank", "g", pl.coalesce("cut", "lo").alias("cut"))
    windows = groups.join(cuts.select("rank", pl.col("g") + 1, pl.col("cut").alias("start_cut")),
                          on=["rank", "g"], how="left").join(cuts.rename({"cut": "end_cut"}), on=["rank", "g"],
                                                             how="left")
    return windows.filter(~pl.col("step").is_in([_BEFORE, _AFTER])).select(
        "rank", pl.col("step").cast(pl.Int32), pl.coalesce("start_cut", "lo").alias("start_ns"),
        pl.coalesce("end_cut", "hi").alias("end_ns")).sort("rank", "step")


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
