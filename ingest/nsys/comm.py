"""What each communication kernel of an nsys export did: op, kernel_op, dtype, and the evidence for the op.

The kernel name gives the collective and dtype (comm_names.parse_nccl_kernel), but NCCL runs all_to_all and
pipeline send/recv as the same ``SendRecv`` kernel, and RCCL names every collective ``Generic``. For those the
host side decides, in this order:

1. NCCL's own NVTX ranges (domain "NCCL": ncclAlltoAll, ncclSend, ncclRecv, ncclAllReduce ...). They are API
   calls on the launching thread; every call since that thread's previous NCCL launch belongs to the next launch
   (a ncclGroupStart ... ncclGroupEnd group launches one kernel). Only sends -> Send, only receives -> Recv,
   ncclAlltoAll -> AllToAll, one collective -> that collective; a mix of sends and receives stays undecided.
2. PyTorch's NVTX ranges (``nccl:all_to_all``, ``nccl:send``, ``nccl:recv`` ...) that enclose the launch.

A kernel is tied to its launch by the CUDA runtime record with the same (pid, correlationId): correlation ids are
unique only within a process. Undecided kernels keep the op their name says ('SendRecv', 'Generic'), with
evidence 'name-rule'. The third route, the peer pattern against the layout, needs the peers of NCCL's NVTX
payloads, which exports carry only with blobs; it is not implemented.
"""

from __future__ import annotations

import polars as pl

from traceana.ingest.comm_names import canonical_op, parse_nccl_kernel

FUSED = ("SendRecv", "Generic")  # kernel names that do not say which logical op ran
_NCCL_API = r"^nccl[A-Z]"         # NCCL's range names are its API function names
_FRAMEWORK = r"^nccl:"            # PyTorch ProcessGroupNCCL profiling titles


def _op_of_names(names: pl.Series) -> pl.DataFrame:
    """name -> canonical op, computed once per distinct name."""
    unique = names.unique().drop_nulls()
    return pl.DataFrame({"name": unique, "op": [canonical_op(n) for n in unique]},
                        schema={"name": pl.String(), "op": pl.String()})


def kernel_columns(names: pl.Series) -> pl.DataFrame:
    """short name -> (kernel_op, dtype) for NCCL/RCCL kernel names, computed once per distinct name."""
    unique = names.unique().drop_nulls().to_list()
    parsed = [parse_nccl_kernel(n) for n in unique]
    return pl.DataFrame({"short": unique, "kernel_op": [p[0] for p in parsed], "dtype": [p[1] for p in parsed]},
                        schema={"short": pl.String(), "kernel_op": pl.String(), "dtype": pl.String()})


def _nccl_api_ops(launches: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """key -> op decided by the NCCL API calls issued on the launching thread since its previous NCCL launch."""
    api = ranges.filter((pl.col("domain") == "NCCL") | pl.col("name").str.contains(_NCCL_API))
    api = api.join(_op_of_names(api["name"]), on="name").select("pid", "tid", "start_ns", "op").sort("start_ns")
    if api.is_empty():
        return pl.DataFrame(schema={"key": pl.Int64(), "nvtx_op": pl.String()})
    issued = api.join_asof(launches.sort("launch_ns"), left_on="start_ns", right_on="launch_ns", by=["pid", "tid"],
                           strategy="forward", check_sortedness=False).drop_nulls("key")
    ops = issued.group_by("key").agg(pl.col("op").unique().alias("ops"))
    only = pl.col("ops").list.len() == 1
    decided = (
        pl.when(pl.col("ops").list.contains("AllToAll")).then(pl.lit("AllToAll"))
        .when(only).then(pl.col("ops").list.first())
        .otherwise(None)
    )
    return ops.select("key", decided.alias("nvtx_op")).drop_nulls("nvtx_op")


def _framework_ops(launches: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """key -> op of the innermost PyTorch ``nccl:*`` range around the launch on the same thread."""
    framework = ranges.filter(pl.col("name").str.contains(_FRAMEWORK) & (pl.col("domain").fill_null("") != "NCCL"))
    framework = framework.join(_op_of_names(framework["name"]), on="name").drop_nulls("op")
    if framework.is_empty():
        return pl.DataFrame(schema={"key": pl.Int64(), "cpu_op": pl.String()})
    enclosing = launches.sort("launch_ns").join_asof(
        framework.select("pid", "tid", "start_ns", "end_ns", "op").sort("start_ns"),
        left_on="launch_ns", right_on="start_ns", by=["pid", "tid"], strategy="backward", check_sortedness=False,
    )
    return enclosing.filter(pl.col("end_ns") >= pl.col("launch_ns")).select("key", pl.col("op").alias("cpu_op"))


def collective_ops(comm: pl.DataFrame, launches: pl.DataFrame | None, ranges: pl.DataFrame | None) -> pl.DataFrame:
    """op, kernel_op, dtype and evidence per communication kernel.

    ``comm``: key, pid, correlationId, short (kernel base name), rule_op (what the rule table fixes).
    ``launches``: CUDA runtime records pid, tid, correlationId, launch_ns. ``ranges``: NVTX pid, tid, start_ns,
    end_ns, name, domain. Kernels with no op at all (NVSHMEM, DeepEP notify ...) are left out.
    """
    kernels = comm.join(kernel_columns(comm["short"]), on="short", how="left").with_columns(
        pl.coalesce("kernel_op", "rule_op").alias("kernel_op")
    ).drop_nulls("kernel_op")
    decided = pl.DataFrame(schema={"key": pl.Int64(), "nvtx_op": pl.String(), "cpu_op": pl.String()})
    fused = kernels.filter(pl.col("kernel_op").is_in(FUSED))
    if not fused.is_empty() and launches is not None and ranges is not None and not ranges.is_empty():
        tied = fused.select("key", "pid", "correlationId").join(launches, on=["pid", "correlationId"])
        tied = tied.select("key", "pid", "tid", "launch_ns")
        decided = _nccl_api_ops(tied, ranges).join(_framework_ops(tied, ranges), on="key", how="full",
                                                   coalesce=True)
    out = kernels.join(decided, on="key", how="left")
    return out.select(
        "key",
        pl.coalesce("nvtx_op", "cpu_op", "kernel_op").alias("op"),
        "kernel_op",
        "dtype",
        pl.when(pl.col("nvtx_op").is_not_null()).then(pl.lit("nvtx"))
        .when(pl.col("cpu_op").is_not_null()).then(pl.lit("op-only"))  # PyTorch's range names no group
        .otherwise(pl.lit("name-rule")).alias("evidence"),
    )
