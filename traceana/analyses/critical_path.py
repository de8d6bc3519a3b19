"""The cross-rank critical path of one step: the chain of device work and waits that set the step's length.

Nodes are the step's device events on every rank (view critical_path_nodes, clipped to each rank's window). The
walk starts where the step ends last (the rank whose window ends latest, at that end; of ranks whose windows end
together, the one whose work ends latest) and goes backwards in time:

- Within a rank, the predecessor of time t is what ran just before it: an event that covers t (start < t <= end;
  of several, the one that started first, so nested or overlapping streams count once), else the event that ended
  last before t, with the gap between them on the path as ``idle``. With one stream this is stream order; with
  several it follows the busy chain. A gap's name says what the event after it was waiting for, from its launch
  time (device_events.launch_ns): 'idle (host launch)' when it was launched after the gap began (the host was
  late), 'idle (queued)' when it was already queued (a dependency held it), plain 'idle' without launch records.
- Across ranks, a collective instance ends when its last member arrives. Reaching a member that started before the
  last arriver, the path keeps the part after the arrival (the transfer) and continues on the last arriver's rank at
  its arrival: its critical predecessor is the work that rank did before. Pipeline Send/Recv pairs are instances of
  two, so a receiver that waited continues on the sending stage.
- The walk stops at the step's first start (the earliest window start over ranks); time before the first event it
  reaches is idle. Every step moves t strictly backwards, so the segments tile [first start, last end] exactly and
  their shares add up to 100%.

One step at a time, with two binary searches per segment over each rank's events sorted by start (and the running
maximum of their ends; DuckDB sorts the step, and each rank is a slice of it): the loop runs once per path segment,
never once per event of the step. The walk reads the
step's events without their names, which are fetched for the path's few events after it: a step of 1,024 ranks of
hta_rank3of8_6steps holds 1.6 M events, 516 MiB as a frame with their names.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from traceana import store
from traceana.analyses.breakdown import check_step, steps
from traceana.errors import TraceanaError

SEGMENT_COLUMNS = ("rank", "stage", "kind", "dim", "name", "start_ns", "end_ns")
NODE_COLUMNS = ("rank", "event_id", "start_ns", "end_ns", "category", "dim", "ranks_seen", "last_rank",
                "last_start_ns", "launch_ns")


def default_step(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """The run's second step (the first carries warm-up), or its only one."""
    known = steps(con, run_id)
    if not known:
        raise TraceanaError(f"run {run_id!r} has no device events, so no critical path")
    return known[1] if len(known) > 1 else known[0]


def checked_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None) -> int:
    """``step`` (check_step's one-line error where the run lacks it), else :func:`default_step`: the step a
    one-step report reads."""
    step = default_step(con, run_id) if step is None else step
    check_step(con, run_id, step)
    return step


def load_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(windows, nodes) of one step: each rank's window, and the critical_path_nodes columns :func:`walk` reads
    (NODE_COLUMNS: not the events' names), in its order and in one chunk, so that its arrays are views of them."""
    check_step(con, run_id, step)
    windows = con.sql(
        "SELECT w.rank, r.pp, w.start_ns, w.end_ns FROM step_windows w LEFT JOIN ranks r USING (run_id, rank) "
        "WHERE w.run_id = ? AND w.step = ? ORDER BY r.pp NULLS FIRST, w.rank", params=[run_id, step]).pl()
    try:
        nodes = con.sql(f"SELECT {', '.join(NODE_COLUMNS)} FROM critical_path_nodes WHERE run_id = ? AND step = ? "
                        "ORDER BY rank, start_ns, end_ns DESC, event_id", params=[run_id, step]).pl().rechunk()
    except duckdb.CatalogException:
        raise TraceanaError(store.OUTDATED) from None
    return windows, nodes


def of_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    """(step, windows, segments): the path of ``step`` (None: :func:`default_step`), as the command, the report,
    the Perfetto export and the Python API all take it."""
    step = default_step(con, run_id) if step is None else step
    windows, nodes = load_step(con, run_id, step)
    return step, windows, named(con, run_id, walk(windows, nodes))


def named(con: duckdb.DuckDBPyConnection, run_id: str, walked: pl.DataFrame) -> pl.DataFrame:
    """:func:`walk`'s segments with their events' names (columns SEGMENT_COLUMNS)."""
    con.register("path_events", walked.filter(pl.col("event_id").is_not_null()).select("rank", "event_id").unique())
    try:
        names = con.sql("SELECT e.rank::INTEGER AS rank, e.event_id, e.name AS event_name FROM device_events e "
                        "SEMI JOIN path_events k ON k.rank = e.rank AND k.event_id = e.event_id "
                        "WHERE e.run_id = $run", params={"run": run_id}).pl()
    finally:
        con.unregister("path_events")
    return (walked.join(names, on=["rank", "event_id"], how="left", maintain_order="left")
            .with_columns(pl.coalesce(pl.col("event_name").cast(pl.String), "name").alias("name"))
            .select(SEGMENT_COLUMNS))


def walk(windows: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """The path's segments in time order, ns on the run timeline (see the module doc): SEGMENT_COLUMNS, ``name``
    named only for idle segments ("" for an event's), and ``event_id``, the event a segment is part of
    (:func:`named` gives it the event's name). ``nodes``: NODE_COLUMNS sorted by rank, start_ns, end_ns descending
    (:func:`load_step`'s order), read in place: each rank is a slice of its columns, not a sorted copy."""
    origin = int(windows["start_ns"].min())
    last_work = nodes.group_by("rank").agg(pl.col("end_ns").max().alias("work_end_ns"))
    end_row = (windows.join(last_work, on="rank", how="left")
               .sort("end_ns", "work_end_ns", "rank", descending=[True, True, False], nulls_last=True)
               .row(0, named=True))
    stage = dict(zip(windows["rank"], windows["pp"], strict=True))
    starts, ends = nodes["start_ns"].to_numpy(), nodes["end_ns"].to_numpy()
    seen, last_rank = nodes["ranks_seen"].fill_null(0).to_numpy(), nodes["last_rank"].fill_null(-1).to_numpy()
    last_start, launch = nodes["last_start_ns"].fill_null(0).to_numpy(), nodes["launch_ns"].fill_null(-1).to_numpy()
    in_order = nodes["rank"].to_numpy()
    present = np.unique(in_order)
    bounds = dict(zip(present.tolist(), zip(np.searchsorted(in_order, present, "left").tolist(),
                                            np.searchsorted(in_order, present, "right").tolist(), strict=True),
                      strict=True))
    reach = np.empty_like(ends)  # per rank, the latest end of the events started so far
    for lo, hi in bounds.values():
        np.maximum.accumulate(ends[lo:hi], out=reach[lo:hi])

    def idle(rank: int, start: int, end: int) -> tuple[int, None, int, int, str]:
        """An idle segment, named by what the event that ends it says: launched after the device ran dry (the host
        was late), already queued (it waited on a dependency), or nothing (no launch record)."""
        name = "idle"
        if rank in bounds and start > origin:
            lo, hi = bounds[rank]
            i = lo + int(np.searchsorted(starts[lo:hi], end, "left"))
            if i < hi and starts[i] == end and launch[i] >= 0:
                name = "idle (host launch)" if launch[i] > start else "idle (queued)"
        return rank, None, start, end, name

    backwards: list[tuple[int, int | None, int, int, str]] = []  # (rank, row in nodes or None, start, end,
    #                                                                idle segment's name)
    rank, t = end_row["rank"], int(end_row["end_ns"])
    while t > origin:
        if rank not in bounds:
            backwards.append(idle(rank, origin, t))
            break
        lo, hi = bounds[rank]
        k = lo + int(np.searchsorted(starts[lo:hi], t, "left")) - 1  # the rank's events that started before t
        if k < lo:
            backwards.append(idle(rank, origin, t))
            break
        top = min(int(reach[k]), t)  # t when an event covers it, else the latest end before t
        if top < t:
            backwards.append(idle(rank, top, t))
        j = lo + int(np.searchsorted(reach[lo:hi], top, "left"))  # the first-started event that reaches top
        arrived = int(last_start[j])
        if seen[j] > 1 and last_rank[j] != rank and starts[j] < arrived < top:
            backwards.append((rank, j, arrived, top, ""))
            rank, t = int(last_rank[j]), arrived
        else:
            backwards.append((rank, j, int(starts[j]), top, ""))
            t = int(starts[j])
    path = pl.DataFrame(backwards[::-1], schema={"rank": pl.Int32, "row": pl.Int64, "start_ns": pl.Int64,
                                                 "end_ns": pl.Int64, "idle_name": pl.String}, orient="row")
    used = path["row"].drop_nulls().unique()
    rows = nodes.select("category", "dim", "event_id").gather(used).with_columns(used.alias("row"))
    before = pl.when(pl.col("start_ns") == origin).then(pl.lit("idle: before the walk's first event on this rank"))
    return (path.join(rows, on="row", how="left", maintain_order="left")
            .with_columns(pl.col("rank").replace_strict(stage, default=None, return_dtype=pl.Int32).alias("stage"),
                          pl.col("category").fill_null("idle").alias("kind"),
                          pl.coalesce(pl.when(pl.col("row").is_null()).then(before), "idle_name").alias("name"))
            .select(*SEGMENT_COLUMNS, "event_id"))


def report(segments: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Segments in ms from the step's first start with their share of the step, and totals by rank, stage, kind."""
    origin, length = segments["start_ns"].min(), segments["end_ns"].max() - segments["start_ns"].min()
    ms = segments.with_columns(((pl.col("start_ns") - origin) / 1e6).alias("start_ms"),
                               ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("duration_ms"),
                               (100 * (pl.col("end_ns") - pl.col("start_ns")) / length).alias("share_pct"))

    def totals(*keys: str) -> pl.DataFrame:  # sums of whole ns: exact, whatever order the groups are summed in
        ns = (pl.col("end_ns") - pl.col("start_ns")).sum()
        return (ms.group_by(*keys).agg(pl.len().alias("segments"), (ns / 1e6).alias("duration_ms"),
                                       (100 * ns / length).alias("share_pct"))
                .sort("duration_ms", *keys, descending=[True, *[False] * len(keys)], nulls_last=True))

    return {"segments": ms.drop("start_ns", "end_ns"), "by_rank": totals("rank", "stage"),
            "by_stage": totals("stage"), "by_kind": totals("kind", "dim")}


def communication(con: duckdb.DuckDBPyConnection, run_id: str, step: int, segments: pl.DataFrame) -> dict[str, float]:
    """The path's communication (ms), split: ``exposed_ms`` while its rank ran nothing else, ``overlapped_ms``
    while compute, memcpy or memset ran on another stream of that rank. The walk follows a collective because a
    later event waited for it, but the breakdown charges its overlapped part to COMP, not to a wait; shortening
    only that part shortens the step only as far as the work beside it allows."""
    comm = segments.filter(pl.col("kind") == "comm").select("rank", "start_ns", "end_ns")
    busy = con.sql("SELECT rank::INTEGER AS rank, start_ns AS b_start, end_ns AS b_end FROM activity_intervals "
                   "WHERE run_id = ? AND step = ? AND lane = 'COMP'", params=[run_id, step]).pl()
    both = comm.join_where(busy, pl.col("rank") == pl.col("rank_right"), pl.col("start_ns") < pl.col("b_end"),
                           pl.col("end_ns") > pl.col("b_start")) if not comm.is_empty() else None
    total = int((comm["end_ns"] - comm["start_ns"]).sum())
    overlapped = 0 if both is None or both.is_empty() else int(both.select(
        (pl.min_horizontal("end_ns", "b_end") - pl.max_horizontal("start_ns", "b_start")).sum()).item())
    return {"comm_ms": total / 1e6, "exposed_ms": (total - overlapped) / 1e6, "overlapped_ms": overlapped / 1e6}


def hops(segments: pl.DataFrame) -> pl.DataFrame:
    """The path as a person reads it: consecutive segments on one rank merged into a hop, with its work,
    communication and idle time, and the collective it was entered through (the link from the previous rank)."""
    kind = pl.col("kind")
    return (segments.with_columns((pl.col("rank") != pl.col("rank").shift(1)).fill_null(True).cum_sum().alias("hop"))
            .group_by("hop", maintain_order=True)
            .agg(pl.col("rank", "stage").first(), pl.col("start_ms").first(), pl.col("duration_ms").sum(),
                 pl.col("share_pct").sum(),
                 pl.col("duration_ms").filter(kind.is_in(["compute", "memcpy", "memset"])).sum().alias("work_ms"),
                 pl.col("duration_ms").filter(kind == "comm").sum().alias("comm_ms"),
                 pl.col("duration_ms").filter(kind == "idle").sum().alias("idle_ms"),
                 pl.len().alias("segments"),
                 pl.when(kind.first() == "comm").then(pl.format("{} {}", pl.col("dim").first().fill_null("?"),
                                                                pl.col("name").first())).alias("entered via"))
            .drop("hop"))
