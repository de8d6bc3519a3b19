"""Collectives across nodes: one NIC per GPU, NVLink inside a node, ring or tree, checked by hand and against
published nccl-tests bus bandwidths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from traceana.estimator import comm
from traceana.estimator.config import Config, from_dict, load


def job(tp: int, dp: int, inter: float = 25.0) -> Config:
    """A GPT on A100 nodes of 8 (NVLink bus 230 GB/s, 10 us; ``inter`` GB/s a GPU's NIC, 20 us)."""
    return from_dict({"model": {"layers": 8, "hidden": 4096, "ffn_hidden": 16384, "heads": 32, "vocab": 51200,
                                "seq_len": 2048},
                      "parallel": {"tp": tp, "dp": dp, "global_batch": dp},
                      "hardware": {"peak_tflops_bf16": 312, "hbm_gb": 80, "devices_per_node": 8,
                                   "bandwidth_gb_per_s": {"intra": 230, "inter": inter},
                                   "latency_us": {"intra": 10, "inter": 20}}}, "job.yaml")


def busbw(cfg: Config, dims: tuple[str, ...], nbytes: float = 2**30) -> float:
    """What nccl-tests would print: algbw x 2(n-1)/n for an all-reduce of ``nbytes``."""
    where = comm.span(cfg, dims)
    seconds = comm.collective("all_reduce", nbytes, where, cfg)
    return nbytes / seconds * 2 * (where.size - 1) / where.size / 1e9


def test_all_reduce_across_nodes_by_hand() -> None:
    cfg = job(tp=8, dp=4)  # dp groups: stride 8, one rank on each of 4 nodes; tp: 8 ranks on one node
    dp, tp = comm.span(cfg, ("dp",)), comm.span(cfg, ("tp",))
    assert (dp.size, dp.nodes, tp.nodes) == (4, 4, 1)
    s = 1e9
    # one rank a node: its own NIC, 25 GB/s; tree latency 2·log2(4)·20 us beats the ring's 2·3·20 us
    assert comm.collective("all_reduce", s, dp, cfg) == pytest.approx(2 * 3 / 4 * s / 25e9 + 2 * 2 * 20e-6)
    # inside a node: NVLink, ring latency 2·7·10 us
    assert comm.collective("all_reduce", s, tp, cfg) == pytest.approx(2 * 7 / 8 * s / 230e9 + 14 * 10e-6)
    # a 16-rank group on 2 nodes (8 a node): 8 NICs a node, 200 GB/s, under NVLink's 230; tree latency
    # 2·(1·20 + 7·10) us is less than the ring's 2·15·20 us
    wide = job(tp=1, dp=16)
    where = comm.span(wide, ("dp",))
    assert (where.size, where.nodes) == (16, 2)
    assert comm.collective("all_reduce", s, where, wide) == pytest.approx(2 * 15 / 16 * s / 200e9 + 2 * 90e-6)
    # reduce-scatter and all-gather: ring only, half the bus volume
    assert comm.collective("all_gather", s, where, wide) == pytest.approx(15 / 16 * s / 200e9 + 15 * 20e-6)
    # NVLink caps it when the NICs of a node add up to more
    fat = job(tp=1, dp=16, inter=50.0)
    assert comm.bus_bandwidth(comm.span(fat, ("dp",)), fat) == 230e9


def test_bus_bandwidth_matches_published_nccl_tests() -> None:
    """8 A100 a node with 4 HDR NICs (4 x 25 GB/s shared by 8 GPUs: 12.5 GB/s a GPU). nccl-tests all_reduce_perf,
    1 GiB: 86 GB/s on 2 nodes (NVIDIA/nccl-tests#175), 84.8 average / 96 peak on 3 (NVIDIA/nccl-tests#119), and
    232.5 GB/s inside one node (#175). The model's 100 GB/s is the NICs' line rate: within 16% of the multi-node
    numbers, and 3% of the NVLink one."""
    two_nodes = job(tp=1, dp=16, inter=12.5)
    assert busbw(two_nodes, ("dp",)) == pytest.approx(86, rel=0.16)
    three_nodes = job(tp=1, dp=24, inter=12.5)
    assert busbw(three_nodes, ("dp",)) == pytest.approx(96, rel=0.16)
    assert busbw(job(tp=1, dp=8), ("dp",)) == pytest.approx(232.5, rel=0.03)
    # the flat model this replaces priced the whole group at one NIC: 12.5 GB/s, 7x too slow
    assert busbw(two_nodes, ("dp",)) > 6 * 12.5


def test_tree_latency_grows_with_log_nodes() -> None:
    small = 8.0  # bytes: latency only
    for nodes in (2, 4, 16):
        cfg = job(tp=1, dp=8 * nodes)
        where = comm.span(cfg, ("dp",))
        tree = 2 * (math.ceil(math.log2(nodes)) * 20e-6 + 7 * 10e-6)
        assert comm.collective("all_reduce", small, where, cfg) == pytest.approx(tree, rel=1e-3)


def test_node_limited_fp8_dispatch_by_hand() -> None:
    """DeepSeek-V3's all-to-all (examples/deepseek_v3_dualpipe.yaml): EP 64 over 8 nodes, a token's 8 experts on at
    most 4 nodes, so 4 x 7/8 network copies a token through the sender's 50 GB/s NIC, and 8 x 7/8 NVLink
    forwards at 160 GB/s; the dispatch in FP8 (1 byte), the combine and the backward in BF16; 63 latency steps."""
    cfg = load(Path(__file__).resolve().parents[2] / "examples" / "deepseek_v3_dualpipe.yaml")
    where = comm.span(cfg, ("ep",), expert=True)
    assert (where.size, where.nodes) == (64, 8)
    t, h = 4096, 7168

    def one(element_bytes: int) -> float:
        inter = t * h * element_bytes * 4 * 7 / 8 / 50e9
        intra = t * h * element_bytes * 8 * 7 / 8 / 160e9
        return max(inter, intra) + 63 * 10e-6

    ep = comm.ep_layer(cfg)
    assert ep.forward == pytest.approx(one(1) + one(2), rel=1e-12)
    assert ep.backward == pytest.approx(2 * one(2), rel=1e-12)
