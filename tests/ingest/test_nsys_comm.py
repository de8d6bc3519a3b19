"""NCCL/RCCL kernel names, and the SendRecv / Generic split by the host-side NVTX ranges of an nsys export.

None of the shared exports holds NCCL kernels (the H100 fixture's window has none), so the split is tested as a
rule on small frames shaped like the export's CUDA runtime and NVTX rows: each case is one sequence of API calls
that NCCL or PyTorch issue, and the expected op follows from the rule in ingest/nsys/comm.py.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceana.ingest.comm_names import parse_nccl_kernel
from traceana.ingest.nsys.comm import collective_ops
from traceana.ingest.rules import classify, load_rules

# Real kernel names as NCCL / RCCL generate them (research note nsys-sqlite.md §2.1, Kineto traces in shared/).
NAMES = {
    # NCCL >= 2.19: ncclDevKernel_<Coll>[_<RedOp>_<ty>]_<ALGO>_<PROTO>; algo/proto/redop are not what ran.
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": ("AllReduce", "bfloat16"),
    "ncclDevKernel_AllReduce_Sum_f32_TREE_LL": ("AllReduce", "float32"),
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL": ("ReduceScatter", "float32"),
    "ncclDevKernel_Reduce_Sum_u8_RING_LL": ("Reduce", "uint8"),
    "ncclDevKernel_AllGather_RING_LL": ("AllGather", None),
    "ncclDevKernel_Broadcast_RING_LL": ("Broadcast", None),
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)": ("SendRecv", None),
    "ncclDevKernel_SendRecv": ("SendRecv", None),
    # NCCL < 2.19: ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type> with long type names.
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": ("AllReduce", "float32"),
    "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)": ("AllReduce", "float16"),
    "ncclKernel_ReduceScatter_RING_LL_Sum_bfloat16": ("ReduceScatter", "bfloat16"),
    "ncclKernel_AllGather_RING_LL_Sum_int8_t": ("AllGather", "int8"),
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": ("SendRecv", "int8"),
    "ncclKernel_Broadcast_RING_LL_Sum_uint8_t": ("Broadcast", "uint8"),
    # RCCL: one Generic kernel for every collective.
    "ncclDevKernel_Generic": ("Generic", None),
    "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)": ("Generic", None),
    # Not NCCL.
    "void at::native::vectorized_elementwise_kernel<4>": (None, None),
    "saxpy(double *, double *, double, int)": (None, None),
}


@pytest.mark.parametrize(("name", "expected"), NAMES.items())
def test_parse_nccl_kernel(name: str, expected: tuple[str | None, str | None]) -> None:
    assert parse_nccl_kernel(name) == expected


def test_every_nccl_name_is_communication_by_the_rule_table() -> None:
    frame = pl.DataFrame({"name": list(NAMES)}).with_columns(classify(pl.col("name"), load_rules()))
    comm = dict(zip(frame["name"], frame["category"] == "comm", strict=True))
    assert comm == {n: op is not None for n, (op, _) in NAMES.items()}


PID, TID = 100, 7


def kernels(*rows: tuple[int, str]) -> pl.DataFrame:
    """(correlationId, short name) -> the comm frame collective_ops reads, keys 0.. in order."""
    return pl.DataFrame(
        {"key": list(range(len(rows))), "pid": [PID] * len(rows), "correlationId": [c for c, _ in rows],
         "short": [s for _, s in rows], "rule_op": [None] * len(rows)},
        schema={"key": pl.Int64(), "pid": pl.Int64(), "correlationId": pl.Int64(), "short": pl.String(),
                "rule_op": pl.String()},
    )


def launches(*rows: tuple[int, int]) -> pl.DataFrame:
    """(correlationId, launch time) on thread TID of process PID."""
    return pl.DataFrame({"pid": [PID] * len(rows), "tid": [TID] * len(rows), "correlationId": [c for c, _ in rows],
                         "launch_ns": [t for _, t in rows]}, schema={c: pl.Int64() for c in
                                                                      ("pid", "tid", "correlationId", "launch_ns")})


def ranges(*rows: tuple[int, int, str, str | None]) -> pl.DataFrame:
    """(start, end, name, domain) NVTX ranges on thread TID of process PID."""
    return pl.DataFrame(
        {"pid": [PID] * len(rows), "tid": [TID] * len(rows), "start_ns": [r[0] for r in rows],
         "end_ns": [r[1] for r in rows], "name": [r[2] for r in rows], "domain": [r[3] for r in rows]},
        schema={"pid": pl.Int64(), "tid": pl.Int64(), "start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(),
                "domain": pl.String()},
    )


def ops(frame: pl.DataFrame) -> list[tuple[str, str]]:
    return frame.sort("key").select("op", "evidence").rows()


SEND_RECV = "ncclDevKernel_SendRecv"


def test_nccl_ranges_since_the_previous_launch_decide_send_then_recv() -> None:
    nvtx = ranges((10, 30, "ncclSend", "NCCL"), (40, 60, "ncclRecv", "NCCL"))
    # ncclSend launches at 20 inside its own range; ncclRecv launches at 50.
    got = collective_ops(kernels((1, SEND_RECV), (2, SEND_RECV)), launches((1, 20), (2, 50)), nvtx)
    assert ops(got) == [("Send", "nvtx"), ("Recv", "nvtx")]


def test_nccl_alltoall_api_range_means_alltoall() -> None:
    got = collective_ops(kernels((5, SEND_RECV)), launches((5, 25)), ranges((10, 40, "ncclAlltoAll", "NCCL")))
    assert ops(got) == [("AllToAll", "nvtx")]


def test_grouped_sends_and_receives_fall_back_to_the_pytorch_range() -> None:
    nvtx = ranges((100, 400, "nccl:all_to_all", None), (110, 120, "ncclGroupStart", "NCCL"),
                  (130, 140, "ncclSend", "NCCL"), (150, 160, "ncclRecv", "NCCL"), (170, 180, "ncclSend", "NCCL"),
                  (190, 200, "ncclRecv", "NCCL"), (210, 300, "ncclGroupEnd", "NCCL"))
    got = collective_ops(kernels((9, SEND_RECV)), launches((9, 250)), nvtx)
    assert ops(got) == [("AllToAll", "op-only")]


def test_pytorch_ranges_alone_decide_and_must_enclose_the_launch() -> None:
    nvtx = ranges((0, 50, "nccl:send", None), (60, 70, "nccl:recv", None))
    got = collective_ops(kernels((1, SEND_RECV), (2, SEND_RECV)), launches((1, 40), (2, 90)), nvtx)
    assert ops(got) == [("Send", "op-only"), ("SendRecv", "name-rule")]  # the second launch is after nccl:recv ended


def test_rccl_generic_takes_the_collective_of_its_nccl_range() -> None:
    got = collective_ops(kernels((3, "ncclDevKernel_Generic")), launches((3, 15)),
                         ranges((10, 20, "ncclAllReduce", "NCCL")))
    assert ops(got) == [("AllReduce", "nvtx")]


def test_correlation_ids_are_matched_within_the_process() -> None:
    other = kernels((1, SEND_RECV)).with_columns(pl.lit(200, pl.Int64()).alias("pid"),
                                                 pl.lit(1, pl.Int64()).alias("key"))
    both = pl.concat([kernels((1, SEND_RECV)), other])
    runtime = pl.concat([launches((1, 20)), launches((1, 500)).with_columns(pl.lit(200, pl.Int64()).alias("pid"))])
    nvtx = pl.concat([ranges((10, 30, "ncclSend", "NCCL")),
                      ranges((490, 510, "ncclRecv", "NCCL")).with_columns(pl.lit(200, pl.Int64()).alias("pid"))])
    assert ops(collective_ops(both, runtime, nvtx)) == [("Send", "nvtx"), ("Recv", "nvtx")]


def test_without_host_ranges_the_name_decides() -> None:
    comm = kernels((1, SEND_RECV), (2, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"))
    got = collective_ops(comm, None, None)
    assert got.sort("key").select("op", "kernel_op", "dtype", "evidence").rows() == [
        ("SendRecv", "SendRecv", None, "name-rule"), ("AllReduce", "AllReduce", "bfloat16", "name-rule")]


def test_rule_table_ops_and_opless_comm_kernels() -> None:
    comm = kernels((1, "deep_ep::intranode::dispatch"), (2, "nvshmemi_proxy_kernel")).with_columns(
        pl.Series("rule_op", ["AllToAll", None]))
    assert collective_ops(comm, None, None).rows() == [(0, "AllToAll", "AllToAll", None, "name-rule")]
