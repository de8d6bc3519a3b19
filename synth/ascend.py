"""Ascend PyTorch profiler (torch_npu) database exports, one ``{host}_{pid}_{time}_ascend_pt`` folder per rank
holding ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_{rank}.db and profiler_info_{rank}.json, with the schema of
the real export in ../shared/traces/ascend/torch_npu_2rank_level1_db (ascend_schema.sql): compute tasks in TASK with
their operator in COMPUTE_TASK_INFO, HCCL ops in COMMUNICATION_OP named ``hcom_allReduce__{hash}_{index}_1`` with
the communicator name as groupName, parallel_group_info (communicator -> tp / dp / pp ..., global ranks) and the
schema version in META_DATA, STEP_TIME, RANK_DEVICE_MAP and HOST_INFO. Times are integer ns of the host's clock.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from traceana.ingest.ascend.groups import double_hash
from traceana.synth import sqlite
from traceana.synth.schedule import (
    COLLECTIVE,
    COLLECTIVES,
    COMPUTE,
    DIMS,
    HCCL_GROUP,
    KERNELS,
    LAUNCH_LEAD_NS,
    RECV,
    SEND,
    STEP_OPEN_NS,
    Plan,
    RankTrace,
)

EPOCH_NS = 1_767_225_600_000_000_000
# Ascend operators in the places of the CUDA kernels of schedule.KERNELS (aclnn API _ kernel _ op type).
OPERATORS = {
    "F": ("aclnnMm_MatMulCommon_MatMulV2", "aclnnFlashAttentionScore_FlashAttentionScore_FlashAttentionScore",
          "aclnnLayerNorm_LayerNormV3_LayerNormV3", "aclnnGelu_GeluV2_GeluV2"),
    "B": ("aclnnMm_MatMulCommon_MatMulV2", "aclnnFlashAttentionScoreGrad_FlashAttentionScoreGrad_"
          "FlashAttentionScoreGrad", "aclnnLayerNormBackward_LayerNormGradV3_LayerNormGradV3"),
    "W": ("aclnnMm_MatMulCommon_MatMulV2",),
    "OPT": ("aclnnApplyAdamWV2_ApplyAdamWV2_ApplyAdamWV2",),
}
DATA_TYPES = {0: "INT8", 1: "INT16", 2: "INT32", 3: "FP16", 4: "FP32", 5: "INT64", 6: "UINT64", 7: "UINT8",
              8: "UINT16", 9: "UINT32", 10: "FP64", 11: "BFP16", 12: "INT128", 65534: "N/A", 65535: "INVALID_TYPE"}


def communicator(plan: Plan, group: dict) -> str:
    """HCCL's communicator name: the first member's host address and NIC, port, the group's index, creation time."""
    host = plan.host_of(group["ranks"][0])
    return f"10.0.{host // 256}.{host % 256}%enp189s0f0_60000_{group['pg']}_1767225600000000"


def folder_name(trace: RankTrace) -> str:
    return f"{trace.host}_{100_000 + trace.rank}_20260101000000000_ascend_pt"


def write_rank(plan: Plan, trace: RankTrace, out: Path) -> Path:
    """One rank's profiler folder under ``out``; returns it."""
    folder = out / folder_name(trace)
    output = folder / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (folder / f"profiler_info_{trace.rank}.json").write_text(json.dumps(
        {"config": {"experimental_config": {"_profiler_level": "Level1", "_export_type": ["db"]}},
         "rank_id": trace.rank}))
    groups = {int(g["pg"]): g for g in plan.process_groups() if trace.rank in g["ranks"]}
    names = {n: i for i, n in enumerate(plan.names)}
    operator = {names[k]: OPERATORS[kind][i] for kind, ks in KERNELS.items() for i, k in enumerate(ks) if k in names}
    hccl_stem = {i: COLLECTIVES[d].hccl for i, d in enumerate(DIMS[:-1])}
    comm_names = {pg: communicator(plan, g) for pg, g in groups.items()}
    strings = ["KERNEL_AICORE", "MESH-RING", *dict.fromkeys(operator.values()), *comm_names.values(),
               *{c.hccl for c in COLLECTIVES.values()}]
    offset = EPOCH_NS + trace.clock_offset_ns
    ops = trace.ops.with_row_index("task").with_columns(pl.col("start_ns") + offset, pl.col("end_ns") + offset)
    compute = ops.filter(pl.col("code") == COMPUTE).with_columns(
        pl.col("name").replace_strict(operator, return_dtype=pl.String).alias("operator"))
    stem = (pl.when(pl.col("code") == SEND).then(pl.lit(COLLECTIVES["SEND"].hccl))
            .when(pl.col("code") == RECV).then(pl.lit(COLLECTIVES["RECV"].hccl))
            .otherwise(pl.col("dim").replace_strict(hccl_stem, default=None, return_dtype=pl.String)))
    comm = ops.filter(pl.col("code") != COMPUTE).with_columns(
        stem.alias("stem"), pl.col("pg").replace_strict(comm_names, default=None, return_dtype=pl.String).alias("comm"),
        pl.int_range(pl.len()).over("pg").alias("index"))
    comm = comm.with_columns(pl.format("{}_{}_{}_1", "stem", pl.col("comm").map_elements(
        lambda c: f"{double_hash(c) % 1000:03d}" if c else "000", return_dtype=pl.String), "index").alias("op_name"))
    strings += comm["op_name"].unique(maintain_order=True).to_list()
    string_id = {s: i for i, s in enumerate(dict.fromkeys(strings))}
    con = sqlite.create(output / f"ascend_pytorch_profiler_{trace.rank}.db", "ascend_schema.sql")
    try:
        sqlite.insert(con, "STRING_IDS", pl.DataFrame({"id": list(string_id.values()), "value": list(string_id)}))
        sqlite.insert(con, "ENUM_HCCL_DATA_TYPE",
                      pl.DataFrame({"id": list(DATA_TYPES), "name": list(DATA_TYPES.values())}))
        sqlite.insert(con, "TASK", compute.select(
            pl.col("start_ns").alias("startNs"), pl.col("end_ns").alias("endNs"),
            pl.lit(trace.device).alias("deviceId"), pl.col("task").alias("connectionId"),
            pl.col("task").alias("globalTaskId"),
            pl.lit(100_000 + trace.rank).alias("globalPid"), pl.lit(string_id["KERNEL_AICORE"]).alias("taskType"),
            pl.lit(4294967295).alias("contextId"), pl.lit(2).alias("streamId"), pl.col("task").alias("taskId"),
            pl.lit(4294967295).alias("modelId"), pl.lit(0).alias("depth")))
        sqlite.insert(con, "COMPUTE_TASK_INFO", compute.select(
            pl.col("operator").replace_strict(string_id, return_dtype=pl.Int64).alias("name"),
            pl.col("task").alias("globalTaskId"), pl.lit(24).alias("blockDim"), pl.lit(0).alias("mixBlockDim"),
            pl.lit(string_id["KERNEL_AICORE"]).alias("taskType")))
        dtype = pl.when(pl.col("dim") == DIMS.index("DP")).then(4).otherwise(11)
        sqlite.insert(con, "COMMUNICATION_OP", comm.select(
            pl.col("op_name").replace_strict(string_id, return_dtype=pl.Int64).alias("opName"),
            pl.col("start_ns").alias("startNs"), pl.col("end_ns").alias("endNs"), pl.col("task").alias("connectionId"),
            pl.col("comm").replace_strict(string_id, default=None, return_dtype=pl.Int64).alias("groupName"),
            pl.int_range(1, pl.len() + 1).alias("opId"), pl.lit(0).alias("relay"), pl.lit(0).alias("retry"),
            dtype.alias("dataType"), pl.lit(string_id["MESH-RING"]).alias("algType"), pl.col("nelems").alias("count"),
            pl.col("stem").replace_strict(string_id, return_dtype=pl.Int64).alias("opType"), pl.lit(0).alias("waitNs")))
        # no host side is written (the store keeps none for Ascend): each step opens 15 µs before its first
        # main-chain task, where the truth's window starts, as a host launching just in time would open it
        steps = ops.filter(pl.col("code") <= COLLECTIVE).group_by("step").agg(
            (pl.col("start_ns").min() - STEP_OPEN_NS - LAUNCH_LEAD_NS).alias("startNs"),
            pl.col("end_ns").max().alias("last")).sort("step")
        sqlite.insert(con, "STEP_TIME", steps.select(
            pl.col("step").alias("id"), "startNs",
            pl.col("startNs").shift(-1).fill_null(pl.col("last") + 10_000).alias("endNs")))
        meta = {"SCHEMA_VERSION_MAJOR": "1", "SCHEMA_VERSION_MINOR": "0", "SCHEMA_VERSION_MICRO": "0",
                "SCHEMA_VERSION": "1.0.0"}
        if plan.options.pg_metadata != "none":
            meta["parallel_group_info"] = json.dumps(
                {comm_names[pg]: {"group_name": HCCL_GROUP[g["dim"]], "group_rank": g["ranks"].index(trace.rank),
                                  "global_ranks": g["ranks"]} for pg, g in groups.items()})
        sqlite.insert(con, "META_DATA", pl.DataFrame({"name": list(meta), "value": list(meta.values())}))
        sqlite.insert(con, "RANK_DEVICE_MAP", pl.DataFrame({"rankId": [trace.rank], "deviceId": [trace.device]}))
        sqlite.insert(con, "HOST_INFO", pl.DataFrame({"hostUid": [str(1_000_003 * (trace.host_index + 1))],
                                                      "hostName": [trace.host]}))
        con.commit()
    finally:
        con.close()
    return folder
