"""Nsight Systems SQLite exports, one report per rank (``nsys profile`` around each torchrun worker), with the
schema of a real 2026.2 export (nsys_schema.sql): kernels in CUPTI_ACTIVITY_KIND_KERNEL with names through StringIds
and a correlationId tying each to its cudaLaunchKernel in CUPTI_ACTIVITY_KIND_RUNTIME; each step's
cudaDeviceSynchronize_v3020 on the main thread in CUPTI_ACTIVITY_KIND_RUNTIME, with its context-synchronize record in
CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (:func:`traceana.synth.schedule.device_syncs`); NVTX ranges on the launching
threads: ProfilerStep#N, PyTorch's ``nccl:*`` titles (as under ``emit_nvtx``) and NCCL's own API ranges in its
"NCCL" domain; the host name in TARGET_INFO_SYSTEM_ENV, the session start in TARGET_INFO_SESSION_START_TIME and the
worker's RANK in META_DATA_CAPTURE.

Times in an export are the host's clock relative to the session start, which each worker opens at its own moment
(drawn up to 30 ms before step 0); utcEpochNs carries that moment on the host's (offset) clock.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl

from traceana.synth import sqlite
from traceana.synth.schedule import (
    COLLECTIVE,
    COLLECTIVES,
    COMPUTE,
    DIMS,
    RECV,
    SEND,
    STEP_OPEN_NS,
    Plan,
    RankTrace,
    device_syncs,
    launch_times,
    stream_of,
)

EPOCH_NS = 1_767_225_600_000_000_000
VERSION = "2026.2.1.210"
NVTX_PUSH_POP, NVTX_DOMAIN_CREATE = 59, 75
# NCCL's API call(s) behind each op: all-to-all is a group of sends and receives
NCCL_API = {"AllReduce": ("ncclAllReduce",), "AllGather": ("ncclAllGather",), "ReduceScatter": ("ncclReduceScatter",),
            "AllToAll": ("ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"), "Send": ("ncclSend",),
            "Recv": ("ncclRecv",)}
LAUNCH, SYNC = "cudaLaunchKernel_v7000", "cudaDeviceSynchronize_v3020"
# cudaDeviceSynchronize's record: CUpti_ActivitySynchronizationType CONTEXT_SYNCHRONIZE (cupti_activity.h), no
# stream and no event (CUPTI's invalid id), as in the 1,312 rows of
# ../shared/traces/nsys/pipit_cloverleaf_4gpu_nsys2024.5.sqlite (which say syncType 1, EVENT_SYNCHRONIZE, there)
CONTEXT_SYNCHRONIZE, CUPTI_INVALID = 4, 4294967295


def short_name(name: str) -> str:
    """nsys's shortName: the function's base name, without return type, namespaces, template and parameters."""
    base = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(base)
    for i, ch in enumerate(base):  # the first '<' or '(' outside brackets ends the qualified name
        if ch in "<(" and depth == 0:
            cut = i
            break
    return base[:cut].split("::")[-1]


def file_name(trace: RankTrace) -> str:
    return f"report_rank{trace.rank:04d}_{trace.host}.sqlite"


def write_rank(plan: Plan, trace: RankTrace, out: Path) -> Path:
    """One rank's export under ``out``; returns its path."""
    pid = 100_000 + trace.rank
    gpid = pid << 24
    session = -int(np.random.default_rng([plan.options.seed, 3, trace.rank]).integers(1_000_000, 30_000_000))
    shift = -session  # raw = true - session start (the host offset cancels: both are read on its clock)
    api_of = {COLLECTIVES[d].op: NCCL_API[COLLECTIVES[d].op] for d in COLLECTIVES}
    strings = [*plan.names, *{short_name(n) for n in plan.names}, LAUNCH, SYNC, "python3", "pt_p2p"]
    string_id = {s: i for i, s in enumerate(dict.fromkeys(strings))}
    launch = launch_times(trace)
    syncs = device_syncs(trace.ops, launch).with_columns(pl.col("start_ns", "device_end_ns", "end_ns") + shift,
                                                          (pl.col("step") + 1 + trace.ops.height).alias("corr"))
    ops = trace.ops.with_columns(launch.alias("launch"), pl.int_range(1, pl.len() + 1).alias("corr"))
    names = pl.Series(plan.names)
    ops = ops.with_columns(
        pl.col("name").map_batches(lambda s: names.gather(s), return_dtype=pl.String).alias("kname"),
        pl.col("cpu_op").map_batches(lambda s: names.gather(s), return_dtype=pl.String).alias("cname"),
        pl.when(pl.col("code") > COLLECTIVE).then(pid + 1).otherwise(pid).alias("tid"),
    )
    short = {i: string_id[short_name(n)] for i, n in enumerate(plan.names)}  # plan.names hold ids 0..n-1
    ops = ops.with_columns(pl.col("name").cast(pl.Int64).alias("demangled"),
                           pl.col("name").replace_strict(short, return_dtype=pl.Int64).alias("short"),
                           (gpid + pl.col("tid")).alias("gtid"))
    con = sqlite.create(out / file_name(trace), "nsys_schema.sql")
    try:
        sqlite.insert(con, "StringIds", pl.DataFrame({"id": list(string_id.values()), "value": list(string_id)}))
        stream = stream_of(pl.col("code"), pl.col("dim"))
        sqlite.insert(con, "CUPTI_ACTIVITY_KIND_KERNEL", ops.select(
            (pl.col("start_ns") + shift).alias("start"), (pl.col("end_ns") + shift).alias("end"),
            pl.lit(trace.device).alias("deviceId"), pl.lit(1).alias("contextId"), stream.alias("streamId"),
            pl.col("corr").alias("correlationId"), pl.lit(gpid).alias("globalPid"),
            pl.col("demangled").alias("demangledName"), pl.col("short").alias("shortName"),
            pl.lit(0).alias("launchType"), pl.lit(0).alias("cacheConfig"), pl.lit(128).alias("registersPerThread"),
            pl.when(pl.col("code") == COMPUTE).then(264).otherwise(32).alias("gridX"), pl.lit(1).alias("gridY"),
            pl.lit(1).alias("gridZ"), pl.lit(256).alias("blockX"), pl.lit(1).alias("blockY"), pl.lit(1).alias("blockZ"),
            pl.lit(0).alias("staticSharedMemory"), pl.lit(0).alias("dynamicSharedMemory"),
            pl.lit(0).alias("localMemoryPerThread"), pl.lit(0).alias("localMemoryTotal"),
            pl.col("corr").alias("gridId"), pl.lit("[]").alias("tensorSizeMinusOneElements")))
        sqlite.insert(con, "CUPTI_ACTIVITY_KIND_RUNTIME", ops.select(
            (pl.col("launch") + shift).alias("start"), (pl.col("launch") + 2_000 + shift).alias("end"),
            pl.lit(0).alias("eventClass"), pl.col("gtid").alias("globalTid"), pl.col("corr").alias("correlationId"),
            pl.lit(string_id[LAUNCH]).alias("nameId"), pl.lit(0).alias("returnValue")))
        sqlite.insert(con, "CUPTI_ACTIVITY_KIND_RUNTIME", syncs.select(
            pl.col("start_ns").alias("start"), pl.col("end_ns").alias("end"), pl.lit(0).alias("eventClass"),
            pl.lit(gpid + pid).alias("globalTid"), pl.col("corr").alias("correlationId"),
            pl.lit(string_id[SYNC]).alias("nameId"), pl.lit(0).alias("returnValue")))
        sqlite.insert(con, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", syncs.select(  # inside the call, to the device's end
            (pl.col("start_ns") + 1_000).alias("start"), pl.col("device_end_ns").alias("end"),
            pl.lit(trace.device).alias("deviceId"), pl.lit(1).alias("contextId"),
            pl.lit(CUPTI_INVALID).alias("streamId"), pl.col("corr").alias("correlationId"),
            pl.lit(gpid).alias("globalPid"), pl.lit(CONTEXT_SYNCHRONIZE).alias("syncType"),
            pl.lit(CUPTI_INVALID).alias("eventId"), pl.lit(0).alias("eventSyncId")))
        sqlite.insert(con, "NVTX_EVENTS", _nvtx(ops, syncs, api_of, gpid + pid, shift))
        threads = {"nameId": [string_id["python3"], string_id["pt_p2p"]], "priority": [20, 20],
                   "globalTid": [gpid + pid, gpid + pid + 1]}
        sqlite.insert(con, "ThreadNames", pl.DataFrame(threads))
        _metadata(con, plan, trace, session)
        con.commit()
    finally:
        con.close()
    return out / file_name(trace)


def _nvtx(ops: pl.DataFrame, syncs: pl.DataFrame, api_of: dict[str, tuple[str, ...]], main_tid: int,
          shift: int) -> pl.DataFrame:
    """ProfilerStep#N on the main thread, from 10 µs before the step's first launch to the next one's start (the
    last to 10 µs after the device's last work, past its sync's return); per communication launch, PyTorch's nccl:*
    range around it and NCCL's API call(s) just before it (domain 1, created as "NCCL")."""
    columns = ["start", "end", "eventType", "text", "globalTid", "domainId"]
    steps = ops.filter(pl.col("code") <= COLLECTIVE).group_by("step").agg(
        (pl.col("launch").min() - STEP_OPEN_NS + shift).alias("start")).sort("step")
    steps = steps.select("start", pl.col("start").shift(-1).fill_null(syncs["device_end_ns"].last() + 10_000)
                         .alias("end"),
                         pl.lit(NVTX_PUSH_POP).alias("eventType"), pl.format("ProfilerStep#{}", "step").alias("text"),
                         pl.lit(main_tid).alias("globalTid"), pl.lit(0).alias("domainId"))
    comm = ops.filter(pl.col("code") != COMPUTE)
    framework = comm.select((pl.col("launch") - 2_000 + shift).alias("start"),
                            (pl.col("launch") + 4_000 + shift).alias("end"), pl.lit(NVTX_PUSH_POP).alias("eventType"),
                            pl.col("cname").alias("text"), pl.col("gtid").alias("globalTid"),
                            pl.lit(0).alias("domainId"))
    op = (pl.when(pl.col("code") == SEND).then(pl.lit("Send")).when(pl.col("code") == RECV).then(pl.lit("Recv"))
          .otherwise(pl.col("dim").replace_strict({i: COLLECTIVES[d].op for i, d in enumerate(DIMS[:-1])},
                                                  default=None, return_dtype=pl.String)))
    calls = comm.with_columns(op.replace_strict({k: list(v) for k, v in api_of.items()},
                                                return_dtype=pl.List(pl.String)).alias("api")).explode("api")
    calls = calls.with_columns(pl.int_range(pl.len()).over("corr").alias("k"), pl.len().over("corr").alias("n"))
    at = pl.col("launch") - 1_000 * (pl.col("n") - pl.col("k")) + shift  # 1 µs each, in order, before the launch
    api = calls.select(at.alias("start"), (at + 500).alias("end"), pl.lit(NVTX_PUSH_POP).alias("eventType"),
                       pl.col("api").alias("text"), pl.col("gtid").alias("globalTid"), pl.lit(1).alias("domainId"))
    schema = dict(zip(columns, api.dtypes, strict=True))
    create = pl.DataFrame({"start": [0], "end": [None], "eventType": [NVTX_DOMAIN_CREATE], "text": ["NCCL"],
                           "globalTid": [main_tid], "domainId": [1]}, schema=schema)
    return pl.concat([create, steps.cast(schema), framework, api])


def _metadata(con: sqlite3.Connection, plan: Plan, trace: RankTrace, session: int) -> None:
    utc = EPOCH_NS + session + trace.clock_offset_ns
    sqlite.insert(con, "TARGET_INFO_SESSION_START_TIME", pl.DataFrame(
        {"utcEpochNs": [utc], "utcTime": ["2026-01-01T00:00:00"], "localTime": ["2026-01-01T00:00:00"],
         "systemClockNs": [utc - EPOCH_NS + 35_000_000_000]}))
    sqlite.insert(con, "TARGET_INFO_SYSTEM_ENV", pl.DataFrame(
        {"globalVid": [281474976710656] * 2, "devStateName": ["Local (CLI)"] * 2, "name": ["Hostname", "CpuCores"],
         "nameEnum": [619, 1], "value": [trace.host, "112"]}))
    sqlite.insert(con, "META_DATA_EXPORT", pl.DataFrame(
        {"name": ["EXPORT_PRODUCT_NAME", "EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "EXPORT_PARAM_EXPORT_TYPE"],
         "value": ["NVIDIA Nsight Systems", VERSION, "3.25.0", "SQLite"]}))
    env = {"RANK": trace.rank, "LOCAL_RANK": trace.device, "WORLD_SIZE": plan.world, "MASTER_PORT": 29500}
    sqlite.insert(con, "META_DATA_CAPTURE", pl.DataFrame(
        {"name": ["PROCESS_1:ENVIRONMENT_VARIABLE"] * len(env), "value": [f"{k}={v}" for k, v in env.items()]}))
