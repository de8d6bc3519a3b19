"""One Nsight Systems report's synchronizations (the store's ``syncs``), resolved by the shared rules of
:mod:`traceana.ingest.syncs.edges` once report.py's device events are numbered.

CUPTI_ACTIVITY_KIND_SYNCHRONIZATION holds CUPTI's synchronization records: host times of the API call, the
``streamId`` synchronized (stream synchronize) or waiting (stream wait event), the ``eventId``, and the
``correlationId`` of the runtime call, whose name (CUPTI_ACTIVITY_KIND_RUNTIME, StringIds) is the row's name where
the export has it; else the ``syncType`` label (ENUM_CUPTI_SYNC_TYPE, or CUPTI's own names in exports without ENUM
tables). The call decides the kind where the two disagree: the 2024.5 export labels its 1,312 cudaDeviceSynchronize
calls "Event sync". A stream wait's recorded stream comes from CUPTI_ACTIVITY_KIND_CUDA_EVENT (the latest record of
the same event on the process before the wait); an export without those rows leaves the waited edge NULL, counted
in the notes. Blocking cudaMemcpy runtime calls (no SYNCHRONIZATION record) wait for their own copy.
"""

from __future__ import annotations

import polars as pl

from traceana.ingest.nsys.export import Export, pid_of
from traceana.ingest.syncs.edges import SyncCounts, host_waits, stream_waits

_I64 = pl.Int64()
_STR = pl.String()
# CUpti_ActivitySynchronizationType, as ENUM_CUPTI_SYNC_TYPE labels it (2022 exports have no ENUM tables)
SYNC_TYPES = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}
STREAM_WAIT_TYPE = 2
_BLOCKING_COPY = r"^cuda(Memcpy|Memcpy2D|Memcpy3D|MemcpyPeer|MemcpyToSymbol|MemcpyFromSymbol)$"
_VERSION = r"_v\d+$"  # cudaStreamSynchronize_v3020
RAW_SCHEMA = {"pid": _I64, "device": _I64, "name": _STR, "stream_wait": pl.Boolean(), "start_ns": _I64,
              "end_ns": _I64, "stream": _I64, "correlationId": _I64, "record_stream": _I64, "record_ns": _I64}


def _calls(runtime: pl.DataFrame | None, strings: pl.DataFrame, *correlated: pl.DataFrame | None) -> pl.DataFrame:
    """The runtime calls the syncs look up, as pid, correlationId, call (name without its _vNNNN), start, end: those
    of a correlationId that a ``correlated`` frame (sync records, CUDA event records) names or that a blocking copy
    has; of each correlation id the outermost (2022 exports write some calls twice, as cudaMemcpy and
    cudaMemcpy_v3020). Kernel launches, most of the table, are never looked up here, so they are not deduplicated."""
    empty = pl.DataFrame(schema={"pid": _I64, "correlationId": _I64, "call": _STR, "start": _I64, "end": _I64})
    if runtime is None:
        return empty
    copies = strings.filter(pl.col("value").str.replace(_VERSION, "").str.contains(_BLOCKING_COPY))["id"]
    wanted = pl.concat([runtime.filter(pl.col("nameId").is_in(copies.implode()))["correlationId"],
                        *(f["correlationId"] for f in correlated if f is not None)])
    runtime = runtime.filter(pl.col("correlationId").is_in(wanted.implode()))
    return runtime.join(strings.rename({"id": "nameId", "value": "call"}), on="nameId", how="left").select(
        "pid", "correlationId", pl.col("call").str.replace(_VERSION, ""), "start", "end",
    ).drop_nulls("correlationId").sort("start", maintain_order=True).unique(["pid", "correlationId"], keep="first",
                                                                            maintain_order=True)


def _labels(export: Export) -> dict[int, str]:
    if "ENUM_CUPTI_SYNC_TYPE" in export.tables:
        rows = export.rows("SELECT id, label FROM ENUM_CUPTI_SYNC_TYPE")
        return {int(i): str(label) for i, label in rows if isinstance(i, int) and label is not None}
    return SYNC_TYPES


def _events(export: Export) -> pl.DataFrame | None:
    """CUPTI_ACTIVITY_KIND_CUDA_EVENT's rows (None where the export has none)."""
    events = export.frame("CUPTI_ACTIVITY_KIND_CUDA_EVENT", {"timestamp": _I64, "streamId": _I64,
                                                             "correlationId": _I64, "globalPid": _I64, "eventId": _I64})
    return None if events is None or events.is_empty() else events


def _records(events: pl.DataFrame | None, runtime: pl.DataFrame) -> pl.DataFrame | None:
    """CUDA event records as pid, eventId, record_stream, record_ns (the record call's start, else the row's
    timestamp), sorted by record_ns; None where the export has none."""
    if events is None:
        return None
    events = events.with_columns(pid_of("globalPid").alias("pid")).join(
        runtime.select("pid", "correlationId", "start"), on=["pid", "correlationId"], how="left")
    return events.select("pid", "eventId", pl.col("streamId").alias("record_stream"),
                         pl.coalesce("start", "timestamp").alias("record_ns")).drop_nulls("record_ns").sort("record_ns")


def read_syncs(export: Export, strings: pl.DataFrame,
               runtime: pl.DataFrame | None) -> tuple[pl.DataFrame, str | None]:
    """The report's sync records and blocking copies (RAW_SCHEMA), and a note where the kind and the call disagree;
    ``runtime`` is the export's runtime table (Export.runtime)."""
    sync = export.frame("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", {
        "start": _I64, "end": _I64, "deviceId": _I64, "streamId": _I64, "correlationId": _I64, "globalPid": _I64,
        "syncType": _I64, "eventId": _I64})
    events = _events(export) if sync is not None and not sync.is_empty() else None
    runtime = _calls(runtime, strings, sync, events)
    parts, note = [], None
    if sync is not None and not sync.is_empty():
        labels = _labels(export)
        sync = sync.with_columns(pid_of("globalPid").alias("pid")).join(
            runtime.select("pid", "correlationId", "call"), on=["pid", "correlationId"], how="left")
        label = pl.col("syncType").replace_strict(labels, default=None, return_dtype=_STR)
        by_call = pl.col("call").str.contains("StreamWaitEvent")
        wait = pl.when(pl.col("call").is_not_null()).then(by_call).otherwise(pl.col("syncType") == STREAM_WAIT_TYPE)
        sync = sync.with_columns(pl.coalesce("call", label, pl.format("syncType {}", "syncType")).alias("name"),
                                 wait.fill_null(False).alias("stream_wait"), label.alias("_label"))
        odd = sync.filter(pl.col("call").is_not_null() & (by_call != (pl.col("syncType") == STREAM_WAIT_TYPE))
                          | (pl.col("call").str.contains("DeviceSynchronize") & (pl.col("syncType") == 1)))
        if not odd.is_empty():
            pairs = odd.group_by("_label", "call").len().sort("len", descending=True).rows()
            note = (f"{export.path.name}: {odd.height} synchronization records' syncType disagrees with their runtime "
                    f"call ({', '.join(f'{n} {lab} for {call}' for lab, call, n in pairs)}): the call is kept")
        records = _records(events, runtime)
        waits = sync.filter(pl.col("stream_wait"))
        if records is not None and not waits.is_empty():
            waits = waits.sort("start").join_asof(records, left_on="start", right_on="record_ns", by=["pid", "eventId"],
                                                  strategy="backward", check_sortedness=False)
            sync = pl.concat([sync.filter(~pl.col("stream_wait")), waits], how="diagonal_relaxed")
        parts.append(sync.select(
            "pid", pl.col("deviceId").alias("device"), "name", "stream_wait", pl.col("start").alias("start_ns"),
            pl.col("end").alias("end_ns"), pl.col("streamId").alias("stream"), "correlationId",
            *[pl.col(c) if c in sync.columns else pl.lit(None, _I64).alias(c) for c in ("record_stream", "record_ns")]))
    copies = runtime.filter(pl.col("call").str.contains(_BLOCKING_COPY))
    parts.append(copies.select("pid", pl.lit(None, _I64).alias("device"), pl.col("call").alias("name"),
                               pl.lit(False).alias("stream_wait"), pl.col("start").alias("start_ns"),
                               pl.col("end").alias("end_ns"), pl.lit(None, _I64).alias("stream"), "correlationId",
                               pl.lit(None, _I64).alias("record_stream"), pl.lit(None, _I64).alias("record_ns")))
    return pl.concat([p.cast(RAW_SCHEMA) for p in parts]), note  # type: ignore[arg-type]


def resolve(raw: pl.DataFrame, device: pl.DataFrame, keys: pl.DataFrame) -> tuple[pl.DataFrame, SyncCounts]:
    """``raw`` (read_syncs) as syncs rows of the report's units (``keys``: pid, device, rank); ``device`` the
    numbered device events (rank, event_id, stream, times, launch_ns, category, pid, correlationId). A record
    belongs to the unit of its process and device, else to its process's only unit (the 2026.2 export gives the
    second process's records, which drives device 1, deviceId 0); a blocking copy to the unit of its own copy, else
    to its process's only unit; others are left out, counted."""
    own = device.filter(pl.col("category") == "memcpy").group_by("pid", "correlationId").agg(
        pl.col("rank").first().alias("_copy_rank"), pl.col("event_id").min().alias("own_event_id"))
    only = keys.group_by("pid").agg(pl.col("rank").first().alias("_only"), pl.len().alias("_units"))
    raw = raw.join(keys, on=["pid", "device"], how="left", nulls_equal=True).join(
        own, on=["pid", "correlationId"], how="left").join(only, on="pid", how="left")
    copy = pl.col("device").is_null() & ~pl.col("stream_wait")
    only_unit = pl.when(pl.col("_units") == 1).then(pl.col("_only"))
    raw = raw.with_columns(
        pl.when(copy).then(pl.coalesce("_copy_rank", only_unit)).otherwise(pl.coalesce("rank", only_unit))
        .alias("rank"),
        pl.when(copy).then(pl.col("own_event_id")).alias("own_event_id"))
    counts = SyncCounts()
    if lost := raw.filter(pl.col("rank").is_null()).height:
        counts.left_out["{n} synchronizations and blocking copies left out: no rank of their report is their "
                        "process and device"] = lost
    raw = raw.filter(pl.col("rank").is_not_null())
    hosts = host_waits(raw.filter(~pl.col("stream_wait")).sort("start_ns"), device)
    waits, lost = stream_waits(raw.filter(pl.col("stream_wait")), device, device_times=False)
    return pl.concat([hosts, waits]).sort("rank", "start_ns", "end_ns", "name"), counts + lost
