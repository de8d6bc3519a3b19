"""What every ingester returns: one run's tables as Polars frames in the store schema (minus ``run_id``).

Ingesters only parse; :func:`finish` applies the steps every format shares (layout coordinates, group
dimensions, collective instance numbers) so that no ingester re-implements them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceana.errors import TraceanaError
from traceana.layout import Layout, dim_from_name

# Column name -> Polars dtype, per table, in store order (run_id is added by the store).
SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "ranks": {
        "rank": pl.Int32(), "host": pl.String(), "device": pl.Int32(), "pid": pl.Int64(),
        "clock_offset_ns": pl.Int64(), "tp": pl.Int32(), "cp": pl.Int32(), "ep": pl.Int32(), "dp": pl.Int32(),
        "pp": pl.Int32(), "rank_source": pl.String(), "source": pl.String(),
    },
    "process_groups": {
        "pg": pl.String(), "dim": pl.String(), "ranks": pl.List(pl.Int32()), "name": pl.String(),
        "source": pl.String(),
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


def conform(table: str, frame: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` with exactly the store columns of ``table`` (missing ones NULL, extra ones dropped), cast."""
    schema = SCHEMAS[table]
    if frame is None:
        return pl.DataFrame(schema=schema)
    return frame.select(
        [(pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )


@dataclass
class RunData:
    """One run, parsed. Frames may omit columns; :func:`conform` fills them when the store writes."""

    source_format: str
    sources: list[str]
    world_size: int
    tool_version: str | None = None
    rank_source: str | None = None
    notes: list[str] = field(default_factory=list)
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    layout: Layout | None = None  # the user's --layout, else one the trace states (MindSpeed distributed_args)

    def table(self, name: str) -> pl.DataFrame:
        return conform(name, self.frames.get(name))


def finish(data: RunData, layout: Layout | None) -> RunData:
    """Coordinates, group dimensions, collective dims and instance numbers: the steps every format shares.

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
    data.frames["process_groups"] = groups
    data.frames["collectives"] = number_instances(_collective_dims(data.table("collectives"), groups))
    align_hosts(data)
    return data


def align_hosts(data: RunData) -> None:
    """Shift each host's clock onto the first host's by the end times of the collectives they share.

    A collective ends on all its ranks together (each waits for the last), while starts differ by arrival, so ends
    are the clock reference. Ranks of one host share a clock: one offset per host, the median over shared instances
    of (reference end - this host's end), added to the times and to ``ranks.clock_offset_ns``.
    """
    ranks = data.table("ranks")
    if ranks["host"].drop_nulls().n_unique() < 2:
        return
    ends = (
        data.table("collectives").filter(~pl.col("op").is_in(["Send", "Recv"]))
        .join(data.table("device_events").select("rank", "event_id", "end_ns"), on=["rank", "event_id"])
        .join(ranks.select("rank", "host"), on="rank")
        .group_by("host", "instance").agg(pl.col("end_ns").mean())
    )
    reference = ranks.sort("rank")["host"].drop_nulls()[0]
    offsets = (
        ends.join(ends.filter(pl.col("host") == reference).select("instance", pl.col("end_ns").alias("ref")),
                  on="instance")
        .group_by("host").agg((pl.col("ref") - pl.col("end_ns")).median().round().cast(pl.Int64).alias("shift"))
    )
    shift = ranks.select("rank", "host").join(offsets, on="host", how="left").select(
        "rank", pl.col("shift").fill_null(0))
    if shift["shift"].abs().max() == 0:
        return
    data.notes.append("hosts aligned by collective end times: " + ", ".join(
        f"{h} {s / 1e3:+.1f} us" for h, s in offsets.sort("host").iter_rows()))
    for table, columns in TIME_COLUMNS.items():
        frame = data.table(table)
        if not frame.is_empty():
            data.frames[table] = frame.join(shift, on="rank", how="left").with_columns(
                [pl.col(c) + pl.col("shift").fill_null(0) for c in columns]).drop("shift")
    data.frames["ranks"] = ranks.join(shift, on="rank", how="left").with_columns(
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


def _collective_dims(coll: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """A collective's dim is its process group's, unless the ingester decided it by other evidence."""
    joined = coll.join(groups.select("pg", pl.col("dim").alias("_gdim")), on="pg", how="left")
    return joined.with_columns(
        pl.when(pl.col("dim").is_null() | (pl.col("dim") == "UNKNOWN"))
        .then(pl.coalesce("_gdim", pl.lit("UNKNOWN")))
        .otherwise(pl.col("dim"))
        .alias("dim")
    ).drop("_gdim")


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


def require_unique_ranks(ranks: list[int], sources: list[str]) -> None:
    """Two inputs claiming the same rank is a user error, named with both files."""
    seen: dict[int, str] = {}
    for rank, source in zip(ranks, sources, strict=True):
        if rank in seen:
            raise TraceanaError(f"{source}: rank {rank} is also claimed by {seen[rank]}")
        seen[rank] = source
