"""One Ascend rank's stream waits (the store's ``syncs``): its EVENT_WAIT device tasks, each paired with the
EVENT_RECORD task it waited for, resolved on device times by :mod:`traceana.ingest.syncs.edges`.

Neither export names the event: TASK rows (database) and trace_view.json tasks carry stream, task id and
connection id, no event id (the CANN_API calls aclrtRecordEvent / aclrtStreamWaitEvent name none either). So a wait
is paired by time: with the record task on another stream whose end is the latest at or before the wait's end. A
wait that blocked ends right after that record (on the shared level-1 run, 420-440 ns after it); one that did not
block (its event already recorded) pairs with the latest earlier record on another stream. HCCL's own Notify Wait
tasks are inside its ops and are not syncs. HCCL ops are device events without a stream (their tasks hold it): for
the edges an op stands on the stream of its tasks (hccl_task annotations' ``stream``), where the record before a
compute stream's wait and the wait before the op are (stream 4 on the shared level-1 runs). Without HCCL tasks
(profiler level 0) they stand on the rank's one stream that holds event tasks and no other work, if there is one.
"""

from __future__ import annotations

import polars as pl

from traceana.ingest.syncs.edges import SyncCounts, stream_waits

RECORD, WAIT = "EVENT_RECORD", "EVENT_WAIT"


def _op_streams(annotations: pl.DataFrame) -> pl.DataFrame:
    """(name, op_stream): each HCCL op's stream, from its tasks' annotations."""
    tasks = annotations.filter(pl.col("kind") == "hccl_task")
    return tasks.select(pl.col("args").str.json_path_match("$.op").alias("name"),
                        pl.col("args").str.json_path_match("$.stream").cast(pl.Int64(), strict=False)
                        .alias("op_stream")).drop_nulls().unique("name", keep="first", maintain_order=True)


def rank_syncs(events: pl.DataFrame, annotations: pl.DataFrame) -> tuple[pl.DataFrame, SyncCounts]:
    """``events``: the rank's numbered device events (rank, event_id, stream, start_ns, end_ns, name, category);
    ``annotations`` its annotations (the HCCL tasks say their op's stream)."""
    tasks = events.filter(pl.col("category") == "sync")
    waits = tasks.filter(pl.col("name") == WAIT).select("rank", "name", "start_ns", "end_ns", "stream")
    records = tasks.filter(pl.col("name") == RECORD).select(
        "rank", pl.col("stream").alias("record_stream"), pl.col("start_ns").alias("record_ns"),
        pl.col("end_ns").alias("_record_end"))
    # every (wait, other stream that records) pair; the latest record of each such stream by the wait's end
    streams = records.select("rank", "record_stream").unique()
    pairs = waits.with_row_index("_wait").join(streams, on="rank").filter(pl.col("record_stream") != pl.col("stream"))
    pairs = pairs.sort("end_ns").join_asof(
        records.sort("_record_end"), left_on="end_ns", right_on="_record_end", by=["rank", "record_stream"],
        strategy="backward", check_sortedness=False).drop_nulls("_record_end")
    best = pairs.sort("_record_end", descending=True).unique("_wait", keep="first").select(
        "_wait", "record_stream", "record_ns")
    waits = waits.with_row_index("_wait").join(best, on="_wait", how="left").drop("_wait")
    work = events.filter(pl.col("category") != "sync").join(_op_streams(annotations), on="name", how="left")
    idle = set(tasks["stream"].drop_nulls().to_list()) - set(work["stream"].drop_nulls().to_list())
    fallback = pl.lit(next(iter(idle)) if len(idle) == 1 else None, pl.Int64())
    work = work.with_columns(
        pl.coalesce("stream", "op_stream", pl.when(pl.col("category") == "comm").then(fallback)).alias("stream"),
        pl.lit(None, pl.Int64()).alias("launch_ns"))
    rows, counts = stream_waits(waits, work, device_times=True)
    return rows.sort("start_ns", "end_ns"), counts
