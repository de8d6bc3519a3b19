"""Kineto (PyTorch profiler) Chrome-trace JSON, one file per rank, shaped like the real exports in
../shared/traces/kineto: ``{host}_{pid}.{ms}.pt.trace.json`` (the host name is the only place a Kineto trace says
which clock it used), distributedInfo with or without pg_config, ProfilerStep#N user annotations on the main thread,
each kernel launched by a cudaLaunchKernel with its correlation id under an ``aten::`` CPU op, each NCCL kernel under
``record_param_comms`` and an ``nccl:*`` annotation, with the collective's args on the kernel (NCCL 2.19+ names:
all-to-all and pipeline send / recv run as ``ncclDevKernel_SendRecv``) and a gpu_user_annotation over it; each step
ends in a cudaDeviceSynchronize (cbid 165, a correlation id of its own) on the main thread
(:func:`traceana.synth.schedule.device_syncs`).

Every line is built by Polars string expressions and written by its CSV writer (one column, no quoting), so no
Python object is made per event.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl

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

BASE_NS = 1_767_225_600_000_000_000  # baseTimeNanoseconds: 2026-01-01 UTC
ORIGIN_NS = 3_000_000_000_000        # the true timeline's 0 on the trace clock (ts are relative to the base)
NCCL_VERSION = "2.21.5"


def _us(ns: pl.Expr) -> pl.Expr:
    """ns -> Kineto's µs text with three decimals, exactly (no float rounding)."""
    return pl.concat_str([(ns // 1000).cast(pl.String), pl.lit("."), (ns % 1000).cast(pl.String).str.zfill(3)])


def _line(*parts: str | pl.Expr) -> pl.Expr:
    return pl.concat_str([pl.lit(p) if isinstance(p, str) else p.cast(pl.String) for p in parts]).alias("line")


def file_name(trace: RankTrace) -> str:
    return f"{trace.host}_{pid(trace)}.1767225600000.pt.trace.json"


def pid(trace: RankTrace) -> int:
    return 100_000 + trace.rank


def _group_args(plan: Plan) -> dict[int, str]:
    """pg -> the Process Group fields of a collective's args."""
    return {int(g["pg"]): (f',"Process Group Name":"{g["pg"]}","Process Group Description":"{g["desc"]}",'
                           f'"Process Group Ranks":"{g["ranks"]}","Group size":{len(g["ranks"])}')
            for g in plan.process_groups()}


def write_rank(plan: Plan, trace: RankTrace, out: Path, compress: bool = False) -> Path:
    """One rank's trace file under ``out``; returns its path."""
    options, rank_pid = plan.options, pid(trace)
    names = pl.Series([json.dumps(n) for n in plan.names], dtype=pl.String)
    offset = ORIGIN_NS + trace.clock_offset_ns
    ops = trace.ops.with_row_index("_i").with_columns(
        (pl.col("_i").cast(pl.Int64) + 1).alias("ext"), (pl.col("start_ns") + offset).alias("ts"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur"),
        pl.col("name").map_batches(lambda s: names.gather(s), return_dtype=pl.String).alias("kname"),
        pl.col("cpu_op").map_batches(lambda s: names.gather(s), return_dtype=pl.String).alias("cname"),
    )
    launch = launch_times(trace)
    syncs = device_syncs(trace.ops, launch).with_columns(pl.col("start_ns", "end_ns") + offset,
                                                          (pl.col("step") + 1 + ops.height).alias("corr"))
    ops = ops.with_columns(launch.alias("launch") + offset)
    ops = ops.with_columns(
        pl.when(pl.col("code") > COLLECTIVE).then(rank_pid + 1).otherwise(rank_pid).alias("tid"),
        stream_of(pl.col("code"), pl.col("dim")).alias("stream"),
    )
    with_pg = options.pg_metadata != "none"
    coll_name = pl.col("code").replace_strict(
        {SEND: COLLECTIVES["SEND"].coll_name, RECV: COLLECTIVES["RECV"].coll_name}, default=None,
        return_dtype=pl.String)
    for d, dim in enumerate(DIMS[:-1]):
        coll_name = pl.when((pl.col("code") == COLLECTIVE) & (pl.col("dim") == d)).then(
            pl.lit(COLLECTIVES[dim].coll_name)).otherwise(coll_name)
    dtype = pl.when(pl.col("dim") == DIMS.index("DP")).then(pl.lit("Float")).otherwise(pl.lit("BFloat16"))
    group = pl.col("pg").replace_strict(_group_args(plan), default="", return_dtype=pl.String)
    peer = (pl.when(pl.col("code") == SEND).then(pl.format(',"dst rank":{}', "peer"))
            .when(pl.col("code") == RECV).then(pl.format(',"src rank":{}', "peer")).otherwise(pl.lit("")))
    comm_args = pl.concat_str([pl.lit(',"Collective name":"'), coll_name, pl.lit('","In msg nelems":'),
                               pl.col("nelems").cast(pl.String), pl.lit(',"Out msg nelems":'),
                               pl.col("nelems").cast(pl.String), pl.lit(',"dtype":"'), dtype, pl.lit('"'), group, peer])
    comm_args = comm_args if with_pg else pl.lit("")
    comm = ops.filter(pl.col("code") != COMPUTE)
    lines = [
        ops.select(_line(',{"ph":"X","cat":"kernel","name":', pl.col("kname"), ',"pid":0,"tid":', pl.col("stream"),
                         ',"ts":', _us(pl.col("ts")), ',"dur":', _us(pl.col("dur")), ',"args":{"External id":',
                         pl.col("ext"), ',"queued":0,"device":', pl.lit(trace.device), ',"context":1,"stream":',
                         pl.col("stream"), ',"correlation":', pl.col("ext"),
                         pl.when(pl.col("code") != COMPUTE).then(comm_args).otherwise(pl.lit("")), "}}")),
        ops.select(_line(',{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":', pl.lit(rank_pid),
                         ',"tid":', pl.col("tid"), ',"ts":', _us(pl.col("launch")),
                         ',"dur":2.000,"args":{"External id":', pl.col("ext"), ',"cbid":211,"correlation":',
                         pl.col("ext"), "}}")),
        ops.filter(pl.col("code") == COMPUTE).select(
            _line(',{"ph":"X","cat":"cpu_op","name":"', pl.col("cname").str.strip_chars('"'), '","pid":',
                  pl.lit(rank_pid), ',"tid":', pl.col("tid"), ',"ts":', _us(pl.col("launch") - 1_000),
                  ',"dur":4.000,"args":{"External id":', pl.col("ext"), "}}")),
        comm.select(_line(',{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":', pl.lit(rank_pid),
                          ',"tid":', pl.col("tid"), ',"ts":', _us(pl.col("launch") - 3_000),
                          ',"dur":8.000,"args":{"External id":', pl.col("ext"), comm_args, "}}")),
        comm.select(_line(',{"ph":"X","cat":"user_annotation","name":', pl.col("cname"), ',"pid":', pl.lit(rank_pid),
                          ',"tid":', pl.col("tid"), ',"ts":', _us(pl.col("launch") - 2_000),
                          ',"dur":6.000,"args":{"External id":', pl.col("ext"), "}}")),
        comm.select(_line(',{"ph":"X","cat":"gpu_user_annotation","name":', pl.col("cname"), ',"pid":0,"tid":',
                          pl.col("stream"), ',"ts":', _us(pl.col("ts")), ',"dur":', _us(pl.col("dur")),
                          ',"args":{"External id":', pl.col("ext"), "}}")),
        syncs.select(_line(',{"ph":"X","cat":"cuda_runtime","name":"cudaDeviceSynchronize","pid":', pl.lit(rank_pid),
                           ',"tid":', pl.lit(rank_pid), ',"ts":', _us(pl.col("start_ns")), ',"dur":',
                           _us(pl.col("end_ns") - pl.col("start_ns")), ',"args":{"cbid":165,"correlation":',
                           pl.col("corr"), "}}")),
        _steps(ops, syncs, rank_pid),
    ]
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": trace.device, "name": "NVIDIA H200", "totalGlobalMem": 150_754_820_096,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "distributedInfo": _distributed_info(plan, trace),
        "record_shapes": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceName": file_name(trace),
    }
    path = out / (file_name(trace) + (".gz" if compress else ""))
    with gzip.open(path, "wb", compresslevel=1) if compress else path.open("wb") as handle:
        handle.write(json.dumps(header)[:-1].encode() + b',"traceEvents":[\n')
        handle.write(json.dumps({"name": "process_name", "ph": "M", "pid": rank_pid, "tid": 0,
                                 "args": {"name": f"rank{trace.rank}"}}).encode() + b"\n")
        for frame in lines:
            frame.write_csv(handle, include_header=False, quote_style="never")
        handle.write(b"]}\n")
    return path


def _steps(ops: pl.DataFrame, syncs: pl.DataFrame, rank_pid: int) -> pl.DataFrame:
    """ProfilerStep#N on the main thread: from 10 µs before the step's first launch to the next step's start (the
    last to 10 µs after its device sync returns)."""
    first = ops.filter(pl.col("code") <= COLLECTIVE).group_by("step").agg(
        (pl.col("launch").min() - STEP_OPEN_NS).alias("start")).sort("step")
    first = first.with_columns(pl.col("start").shift(-1).fill_null(syncs["end_ns"].last() + 10_000).alias("end"))
    return first.select(_line(',{"ph":"X","cat":"user_annotation","name":"ProfilerStep#', pl.col("step"),
                              '","pid":', pl.lit(rank_pid), ',"tid":', pl.lit(rank_pid), ',"ts":',
                              _us(pl.col("start")), ',"dur":', _us(pl.col("end") - pl.col("start")),
                              ',"args":{"External id":0}}'))


def _distributed_info(plan: Plan, trace: RankTrace) -> dict:
    info: dict = {"backend": "nccl", "rank": trace.rank, "world_size": plan.world}
    if plan.options.pg_metadata == "full":
        mine = [g for g in plan.process_groups() if trace.rank in g["ranks"]]
        info["pg_count"] = len(mine) + 1
        info["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                              "pg_size": plan.world, "ranks": list(range(plan.world))}] + [
            {"pg_name": g["pg"], "pg_desc": g["desc"], "backend_config": "cuda:nccl", "pg_size": len(g["ranks"]),
             "ranks": g["ranks"]} for g in mine]
    info["nccl_version"] = NCCL_VERSION
    return info
