"""Overlap from mechanisms: TP collective matmul, bucketed DP reduction, DualPipe's paired chunks; the overlap
fractions as overrides. Each against the formula worked by hand from the pieces it combines."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import job_config
from traceana.estimator import comm, compute, memory
from traceana.estimator.estimate import _exposed_tp, estimate
from traceana.estimator.pipeline import StageCost, simulate

GPT: dict[str, Any] = {
    "model": {"layers": 8, "hidden": 8192, "ffn_hidden": 32768, "heads": 64, "vocab": 51200, "seq_len": 4096,
              "gated_mlp": False},
    "parallel": {"tp": 8, "dp": 4, "micro_batch": 1, "global_batch": 32, "sequence_parallel": True,
                 "tp_comm_overlap": True},
    "hardware": {"peak_tflops_bf16": 1000, "hbm_gb": 80, "devices_per_node": 8,
                 "bandwidth_gb_per_s": {"intra": 200, "inter": 25}, "latency_us": {"intra": 5, "inter": 10}},
    "calibration": {"matmul_efficiency": 0.5},
}


def gpt(**sections: dict[str, Any]) -> compute.Config:
    return job_config(GPT, **sections)


def test_tp_collective_matmul_leaves_what_the_matmul_cannot_cover() -> None:
    cfg = gpt()
    t, h, tp = 4096, 8192, 8
    # one all-gather (or reduce-scatter) of a block: half of the all-reduce of t·h·2 bytes over 8 NVLink ranks
    half = comm.collective("all_reduce", t * h * 2, comm.span(cfg, ("tp",)), cfg) / 2
    assert half == pytest.approx((2 * 7 / 8 * t * h * 2 / 200e9 + 14 * 5e-6) / 2)
    # the matmuls beside them, FLOPs at 500 TFLOP/s: QKV (t x 3h/tp x h), proj (t x h x h/tp), fc1, fc2 (4h)
    qkv, proj = 2 * t * 3 * h * h / tp / 500e12, 2 * t * h * h / tp / 500e12
    fc1 = fc2 = 2 * t * 4 * h * h / tp / 500e12

    def exposed(c: float, g: float) -> float:
        return max(c / tp, c - g)

    by_hand = exposed(half, qkv) + exposed(half, proj) + exposed(half, fc1) + exposed(half, fc2)
    got = _exposed_tp(cfg, 0, moe=False)
    assert got.forward == pytest.approx(by_hand, rel=1e-9)
    assert got.backward == pytest.approx(by_hand, rel=1e-9)  # input gradients: the same shapes, the same FLOPs
    # here the collectives are longer than the small projections but shorter than the MLP's matmuls
    assert half > proj and half < fc1
    raw = comm.tp_layer(cfg, moe=False)
    assert got.forward < raw.forward
    # a given overlap.tp overrides the mechanism
    override = _exposed_tp(gpt(calibration={"overlap": {"tp": 0.25}}), 0, moe=False)
    assert override.forward == pytest.approx(0.75 * raw.forward, rel=1e-12)
    # without the mechanism, seed 001's default: nothing hidden
    assert _exposed_tp(gpt(parallel={"tp_comm_overlap": False}), 0, moe=False).forward == pytest.approx(raw.forward)


def test_bucketed_dp_reduction_leaves_the_last_bucket() -> None:
    cfg = gpt(parallel={"tp": 2, "tp_comm_overlap": False, "overlap_grad_reduce": True})
    est = estimate(cfg)
    params = memory.device_params(cfg, est.chunks)[0]
    sync = comm.dp_step(cfg, params.dense, params.expert)
    one = est.costs[0]
    window = one.backward + one.wgrad + one.recompute
    assert window > sync.reduce  # the backward is long enough to cover all but the last bucket
    # by hand: Megatron's bucket is max(40M, 1M x dp) parameters; the one holding the first layers closes last
    last = sync.reduce * 40e6 / (params.dense + params.expert)
    assert est.tails[0] == pytest.approx(last, rel=1e-12)
    # seed 001's fixed fraction (10% exposed) where no mechanism is named, and a given overlap.dp overrides
    assert estimate(gpt(parallel={"tp": 2, "tp_comm_overlap": False})).tails[0] == pytest.approx(0.1 * sync.reduce)
    given = estimate(gpt(parallel={"tp": 2, "tp_comm_overlap": False, "overlap_grad_reduce": True},
                         calibration={"overlap": {"dp": 0.5}}))
    assert given.tails[0] == pytest.approx(0.5 * sync.reduce)


def test_dualpipe_pair_takes_the_longer_of_compute_and_all_to_all() -> None:
    """DeepSeek-V3 §3.2.1: a forward chunk and a backward chunk interleave attention, dispatch, MLP and combine, so
    a pair lasts max(F + B + W - EP, EP): here all 0.8 s of EP hides under 2.6 s of compute."""
    p, m = 4, 16
    result = simulate("dualpipe", [StageCost(1.2, 1.2, 1.0, 0.8)] * p, m, 0.0)
    pairs = [sum(1 for s, k in zip(result._plan.stage, result._plan.kind, strict=True) if s == stage and k == "FBW")
             for stage in range(p)]
    assert all(pairs)
    assert result.ep_overlapped_s == pytest.approx([0.8 * n for n in pairs])
    # EP longer than the pair's compute: the pair lasts the EP, and only the compute's worth is hidden
    heavy = simulate("dualpipe", [StageCost(1.2, 1.2, 0.0, 2.0)] * p, m, 0.0)
    assert heavy.ep_overlapped_s == pytest.approx([(2.4 - 2.0) * n for n in pairs])
