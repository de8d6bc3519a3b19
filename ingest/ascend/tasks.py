"""The Ascend task vocabulary shared by the timeline and database readers: which device tasks are work, and what an
HCCL op name says (op, op type, sequence number) and carries (data type, bytes).

A task the runtime names after its own task type (EVENT_RECORD, MEMCPY_ASYNC ...) is not a kernel; everything else
on an Ascend Hardware stream is a kernel named after its operator and goes through the user-extendable rules
(MC2 fused ops become communication there). Kernels are what the profiler's Computing column unions (AI_CORE,
AI_VECTOR_CORE, MIX_AIC/AIV, AI_CPU, DSA); device copies and event/notify tasks are not, so they are stored as
'other' / 'sync' — the breakdown counts neither, which keeps COMP equal to the profiler's Computing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceana.ingest.comm_names import DTYPE_BYTES, canonical_dtype, canonical_op
from traceana.ingest.rules import Rule, classify, per_name

# Runtime task name (timeline) or task type (database) -> category, from the CANN runtime's task-type registry
# (seen in the shared traces: EVENT_RECORD, EVENT_WAIT, MEMCPY_ASYNC, PROFILING_*, Notify Wait, Write Value, SDMA).
# None = a task inside an HCCL op: the op is the comm event, its tasks are hccl_task annotations.
RUNTIME_TASKS: dict[str, str | None] = {
    "EVENT_RECORD": "sync", "EVENT_WAIT": "sync", "EVENT_RESET": "sync", "NOTIFY_WAIT": "sync",
    "NOTIFY_RECORD": "sync", "REMOTE_EVENT_WAIT": "sync", "IPC_EVENT_RECORD": "sync", "IPC_EVENT_WAIT": "sync",
    "MEM_WAIT_VALUE": "sync", "MEM_WRITE_VALUE": "sync", "BARRIER": "sync", "STREAM_SWITCH": "sync",
    "STREAM_ACTIVE": "sync", "LABEL_SWITCH": "sync", "LABEL_GOTO": "sync", "LABEL_SET": "sync",
    "MEMCPY_ASYNC": "other", "PROFILING_ENABLE": "other", "PROFILING_DISABLE": "other", "MAINTENANCE": "other",
    "MODEL_EXECUTE": "other", "MODEL_MAINTAINCE": "other", "CMO": "other", "NOP": "other",
    "HOSTFUNC_CALLBACK": "other", "reserve": "other",
    "Notify Wait": None, "Write Value": None, "SDMA": None,
}

# hcom_{opType}__{last 3 digits of the group hash}_{index of the op in its group}[_{n}]
_HCOM = r"^(hcom_[A-Za-z]+_)_\d+_(\d+)"


def with_task_categories(tasks: pl.DataFrame, rules: list[Rule]) -> pl.DataFrame:
    """``tasks`` with the category of each device task by its runtime ``name``: NULL for HCCL-internal tasks,
    kernels by the rules."""
    names = pl.col("name")
    known = names.is_in(list(RUNTIME_TASKS))
    runtime = names.replace_strict(RUNTIME_TASKS, default=None, return_dtype=pl.String())
    return per_name(tasks, "name", [pl.when(known).then(runtime).otherwise(classify(names, rules)[0])
                                    .alias("category")])


def hcom_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """Add op, kernel_op, seq, dtype and bytes (count x dtype size) to HCCL ops (name, hccl_dtype, count)."""
    frame = frame.with_columns(
        pl.coalesce(pl.col("name").str.extract(_HCOM, 1), "name").alias("kernel_op"),
        pl.col("name").str.extract(_HCOM, 2).cast(pl.Int64).alias("seq"),
    )
    dtypes = {k: canonical_dtype(k) for k in frame["hccl_dtype"].unique().drop_nulls().to_list()}  # a few names
    ops = {k: canonical_op(k) for k in frame["kernel_op"].unique().drop_nulls().to_list()}
    frame = frame.with_columns(pl.col("hccl_dtype").replace_strict(dtypes, default=None, return_dtype=pl.String())
                               .alias("dtype"))
    return frame.with_columns(
        pl.col("kernel_op").replace_strict(ops, default=None, return_dtype=pl.String()).fill_null("Unknown")
        .alias("op"),
        (pl.col("count").cast(pl.Int64)
         * pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)).alias("bytes"),
    )


# Fields of an HCCL task (a plane task of the timeline, a COMMUNICATION_TASK_INFO row) kept in annotations.args.
HCCL_TASK_FIELDS = ("group", "plane", "op", "task_type", "src_rank", "dst_rank", "transport", "link_type",
                    "size_bytes", "bandwidth_GBps", "notify_id", "stream")


def hccl_task_annotations(tasks: pl.DataFrame) -> pl.DataFrame:
    """HCCL tasks (start_ns, end_ns, name and the HCCL_TASK_FIELDS columns) as annotations of kind hccl_task."""
    return tasks.select(
        "start_ns", "end_ns", "name", pl.lit("HCCL").alias("domain"), pl.lit("hccl_task").alias("kind"),
        pl.struct(HCCL_TASK_FIELDS).struct.json_encode().alias("args"),
    )


# A reader's events: device tasks and HCCL ops; the HCCL columns are NULL on tasks. ``comm`` is the communicator name
# when the source states it, ``group_hash`` its double_hash when communication.json states that instead.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(), "category": pl.String(), "stream": pl.Int64(),
    "op": pl.String(), "kernel_op": pl.String(), "seq": pl.Int64(), "dtype": pl.String(), "bytes": pl.Int64(),
    "comm": pl.String(), "group_hash": pl.UInt64(),
}


def rank_events(tasks: pl.DataFrame, hcom: pl.DataFrame) -> pl.DataFrame:
    """Device tasks (HCCL-internal ones dropped) and HCCL ops in EVENT_SCHEMA."""
    frame = pl.concat([tasks.filter(pl.col("category").is_not_null()), hcom], how="diagonal_relaxed")
    return frame.select([(pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c)
                         for c, t in EVENT_SCHEMA.items()])


@dataclass
class RankTrace:
    """One rank's profile as a reader parsed it, before ranks are numbered and groups linked.

    ``events`` are in EVENT_SCHEMA; ``annotations`` and ``steps`` in store columns without rank. ``source`` is the
    file read until the caller replaces it with the folder the rank came from.
    """

    source: Path
    events: pl.DataFrame
    annotations: pl.DataFrame
    steps: pl.DataFrame
    device: int | None = None
    pid: int | None = None
    host: str | None = None
    rank: int | None = None  # what the source itself says
    rank_source: str | None = None
    boot_ns: int | None = None  # wall-clock minus monotonic clock at collection: the host's boot time
    metadata: dict = field(default_factory=dict)  # profiler_metadata.json / META_DATA (parallel_group_info ...)
    memory: pl.DataFrame | None = None  # allocator samples (ts_ns, allocated_bytes, reserved_bytes)
    tool_version: str | None = None
    notes: list[str] = field(default_factory=list)  # what the reader noticed (a broken memory file ...)
