"""The estimator's pieces against published closed forms, and seed 000's P1-P4 as tests.

Second routes: Narayanan et al. SC'21 eq. 3 (FLOPs), Korthikanti et al. 2022 Table 2 (activation bytes), the ZeRO
paper's Figure 1 example (model-state bytes), nccl-tests' bus-bandwidth factors, traceana.layout (Megatron's
RankGenerator) for group placement, and the 1F1B / interleaved bubble fractions for equal stages.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from traceana.estimator import comm, compute, memory, record, timeline
from traceana.estimator.config import from_dict, load, load_runs
from traceana.estimator.estimate import DIMENSIONS, estimate, lower_bound, model_flops, ppb
from traceana.estimator.memory import MIB, Params, states
from traceana.layout import Layout

ROOT = Path(__file__).resolve().parents[2]

GPT: dict[str, Any] = {  # a GPT of Korthikanti's family: ffn 4h, GeLU, scores materialized
    "model": {"layers": 8, "hidden": 2048, "ffn_hidden": 8192, "heads": 16, "vocab": 51200, "seq_len": 2048,
              "gated_mlp": False, "flash_attention": False},
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32},
    "schedule": {"kind": "1f1b"},
    "hardware": {"peak_tflops_bf16": 312, "hbm_gb": 80, "devices_per_node": 8},
}


def gpt(**changes: Any):  # type: ignore[no-untyped-def]
    raw = copy.deepcopy(GPT)
    for key, value in changes.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return from_dict(raw, "gpt")


def reduced(**parallel: Any):  # type: ignore[no-untyped-def]
    """Seed 000's DeepSeek-V3 reduced job (examples/deepseek_v3_reduced.yaml) with parallel / calibration changes."""
    cfg = load(ROOT / "examples" / "deepseek_v3_reduced.yaml")
    cal = parallel.pop("calibration", {})
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel),
                               calibration=dataclasses.replace(cfg.calibration, **cal))


# --- compute --------------------------------------------------------------------------------------------------------

def test_mlp_only_blocks_drop_attention_flops_params_activations_and_its_tp_reduce() -> None:
    """attention: false describes an MLP-only block (seed 002's TP MLP): by hand, a GeLU MLP is 2 matrices of
    h x 4h, 2·2·t·h·4h FLOPs forward on one GPU / tp; one TP all-reduce each way instead of two."""
    full, mlp_only = gpt(), gpt(model__attention=False)
    t, h, tp = compute.tokens(mlp_only), 2048, 2
    assert compute.layer(mlp_only, 0).forward == pytest.approx(2 * 2 * t * h * 4 * h / tp)
    assert compute.layer(mlp_only, 0).forward < compute.layer(full, 0).forward
    assert memory.attention_params(mlp_only) == 0 < memory.attention_params(full)
    assert comm.tp_layer(mlp_only, moe=False).forward == pytest.approx(comm.tp_layer(full, moe=False).forward / 2)
    assert memory.layer_activation_bytes(mlp_only, 0) < memory.layer_activation_bytes(full, 0)


def test_flops_match_narayanan_eq3_with_full_recompute() -> None:
    # Narayanan et al. SC'21 eq. 3: F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) per iteration, full recompute.
    cfg = gpt(schedule__recompute={"kind": "full"}, parallel__tp=1, parallel__pp=1, parallel__dp=1,
              parallel__global_batch=2)
    b, s, h, L, V = 2, 2048, 2048, 8, 51200
    per_gpu = sum((compute.layer(cfg, i) for i in range(L)), compute.Work(0, 0, 0)) + compute.head(cfg)
    assert per_gpu.total == pytest.approx(96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)
    # without recompute it is 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) (Korthikanti §6)
    no = gpt(parallel__tp=1, parallel__pp=1, parallel__dp=1, parallel__global_batch=2)
    plain = sum((compute.layer(no, i) for i in range(L)), compute.Work(0, 0, 0)) + compute.head(no)
    assert plain.total == pytest.approx(72 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)


def test_tp_and_cp_split_the_flops_and_selective_recompute_repeats_the_core() -> None:
    one, tp2 = gpt(parallel__tp=1, parallel__dp=4), gpt()
    assert compute.layer(tp2, 0).forward == pytest.approx(compute.layer(one, 0).forward / 2)
    sel = gpt(schedule__recompute={"kind": "selective"})
    _, core = compute.attention(sel)
    assert compute.layer(sel, 0).recompute == core == pytest.approx(4 * 2 * 2048 * 2048 * 2048 / 2)


def test_moe_flops_count_top_k_and_shared_experts_whatever_ep() -> None:
    base = {"model__experts": 8, "model__moe_topk": 2, "model__expert_ffn_hidden": 1024, "model__shared_experts": 1}
    a, b = gpt(**base, parallel__ep=1), gpt(**base, parallel__ep=2)
    t, h = 2 * 2048, 2048
    routed, shared = compute.moe_parts(a)
    assert routed == pytest.approx(2 * 2 * t * h * 1024 * 2 / 2 + 2 * t * h * 8)  # top-2 GeLU passes / tp + router
    assert shared == pytest.approx(2 * 2 * t * h * 1024 / 2)
    assert compute.layer(a, 3).forward == compute.layer(b, 3).forward


def test_dropless_skew_prices_the_stage_at_its_most_loaded_ep_rank() -> None:
    # EP 2, top-2 of 8 experts; EP rank 0's experts receive 1.75x a balanced split, rank 1's 0.25x. Second route:
    # capacity_factor 1.75 prices every rank as the hot one, balanced routing every rank at the mean.
    base = {"model__experts": 8, "model__moe_topk": 2, "model__expert_ffn_hidden": 1024, "parallel__ep": 2}
    skewed = estimate(gpt(**base, model__expert_load=[1.75, 0.25]))
    hot, balanced = estimate(gpt(**base, model__capacity_factor=1.75)), estimate(gpt(**base))
    assert skewed.step_s == pytest.approx(hot.step_s, rel=1e-12) and skewed.step_s > balanced.step_s
    for s, h, b in zip(skewed.stages, hot.stages, balanced.stages, strict=True):
        assert s.comp == pytest.approx(b.comp, rel=1e-12)  # the mean rank computes a balanced share (FLOP-linear)
        assert s.ep_wait == pytest.approx(h.ep_wait + h.comp - b.comp, rel=1e-12)  # the cold rank waits the rest
        assert s.memory.peak == pytest.approx(h.memory.peak, rel=1e-12)  # the hot rank holds the most copies
    assert model_flops(skewed.config) == pytest.approx(model_flops(balanced.config), rel=1e-12)  # useful FLOPs


# --- activations and model states -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sp", "recompute", "per_sbh"), [
    # Korthikanti Table 2, bytes / (s·b·h) for t = 2, a = 16, s = h = 2048 (so 5as/h = 80)
    (False, "none", 10 + 24 / 2 + 5 * 16 * 2048 / (2048 * 2)),
    (True, "none", (34 + 5 * 16 * 2048 / 2048) / 2),
    (False, "selective", 10 + 24 / 2),
    (True, "selective", 34 / 2),
    (False, "full", 2),
    (True, "full", 2 / 2),
])
def test_activation_bytes_match_korthikanti_table_2(sp: bool, recompute: str, per_sbh: float) -> None:
    cfg = gpt(parallel__sequence_parallel=sp, schedule__recompute={"kind": recompute})
    sbh = 2048 * 2 * 2048
    assert memory.layer_activation_bytes(cfg, 0) == pytest.approx(per_sbh * sbh)


def test_model_states_match_the_zero_paper_figure_1() -> None:
    # Rajbhandari et al. Fig. 1: Ψ = 7.5B, N_d = 64, 2 + 2 + 12 bytes: 120 / 31.4 / 16.6 / 1.9 GB.
    raw = copy.deepcopy(GPT)
    raw["precision"] = {"grad_bytes": 2}
    raw["parallel"] = {"tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "global_batch": 64}
    raw["hardware"]["devices_per_node"] = 8
    expected = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for zero, gb in expected.items():
        raw["parallel"]["zero"] = zero
        cfg = from_dict(raw)
        assert sum(states(cfg, Params(7.5e9))) / 1e9 == pytest.approx(gb, abs=0.06)


def test_in_flight_activations_follow_the_schedule() -> None:
    # 1F1B stage i holds min(pp - i, m) micro-batches; GPipe all m
    cfg = gpt(parallel__pp=4, parallel__dp=1, parallel__global_batch=16, model__vocab=64)
    one = memory.layer_activation_bytes(cfg, 0) * 2  # two layers a stage
    acts = [s.memory.activations for s in estimate(cfg).stages]
    for i, held in enumerate(acts[1:3], start=1):
        assert held == pytest.approx(min(4 - i, 8) * one)
    gpipe = estimate(gpt(parallel__pp=4, parallel__dp=1, parallel__global_batch=16, model__vocab=64,
                         schedule__kind="gpipe"))
    assert gpipe.stages[1].memory.activations == pytest.approx(8 * one)


# --- communication --------------------------------------------------------------------------------------------------

def test_collectives_use_the_nccl_bus_factors() -> None:
    cfg = gpt(parallel__tp=8, parallel__dp=1, parallel__pp=1, parallel__global_batch=2,
              hardware__bandwidth_gb_per_s={"intra": 200, "inter": 25}, hardware__latency_us={"intra": 0, "inter": 0})
    tp = comm.span(cfg, ("tp",))
    assert (tp.size, tp.nodes) == (8, 1)
    assert comm.collective("all_reduce", 1e9, tp, cfg) == pytest.approx(2 * 7 / 8 * 1e9 / 200e9)
    assert comm.collective("all_gather", 1e9, tp, cfg) == pytest.approx(7 / 8 * 1e9 / 200e9)
    assert comm.collective("reduce_scatter", 1e9, tp, cfg) == pytest.approx(7 / 8 * 1e9 / 200e9)
    # gloo has no reduce-scatter: ProcessGroupGloo all-reduces the whole input (sample_traces/README.md)
    gloo = dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, collectives="gloo"))
    assert comm.collective("reduce_scatter", 1e9, tp, gloo) == pytest.approx(2 * 7 / 8 * 1e9 / 200e9)
    assert comm.collective("all_gather", 1e9, tp, gloo) == pytest.approx(7 / 8 * 1e9 / 200e9)


def test_sequence_parallel_tp_is_reduce_scatter_and_all_gather() -> None:
    # on NCCL the pair costs the all-reduce it replaces, latency steps too; the embedding and output layer
    # reduce-scatter forward and backward and the output layer all-gathers its input (Megatron-Core)
    args = {"parallel__tp": 8, "parallel__dp": 1, "parallel__pp": 1, "parallel__global_batch": 2}
    plain, sp = gpt(**args), gpt(**args, parallel__sequence_parallel=True)
    assert comm.tp_layer(sp, False) == comm.tp_layer(plain, False)
    where, payload = comm.span(sp, ("tp",)), compute.tokens(sp) * sp.model.hidden * sp.precision.activation_bytes
    scatter, gather = (comm.collective(op, payload, where, sp) for op in ("reduce_scatter", "all_gather"))
    assert comm.tp_embedding_head(sp) == (comm.Pass(scatter, 0.0), comm.Pass(gather, scatter))
    gloo = dataclasses.replace(sp, hardware=dataclasses.replace(sp.hardware, collectives="gloo"))
    ring = comm.collective("all_reduce", payload, where, gloo)
    assert comm.tp_layer(gloo, False).forward == pytest.approx(2 * (ring + gather))  # attention and MLP blocks


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-pp-dp", "dp-tp-pp", "tp-dp-pp"])
def test_group_placement_matches_megatron_rank_generator(order: str) -> None:
    raw = copy.deepcopy(GPT)
    raw["model"].update(experts=16, moe_topk=2)
    raw["parallel"] = {"tp": 2, "pp": 4, "dp": 8, "ep": 4 if "ep" in order else 1, "order": order,
                       "micro_batch": 1, "global_batch": 64}
    cfg = from_dict(raw)
    layout = Layout(tp=2, pp=4, dp=8, ep=cfg.parallel.ep, order=order)
    for dims, kind, expert in ((("tp",), "TP", False), (("dp",), "DP", False), (("pp",), "PP", False),
                               (("ep",), "EP", True)):
        group = next(g for g in layout.groups[kind] if 0 in g)
        where = comm.span(cfg, dims, expert=expert)
        assert where.size == len(group)
        assert where.nodes == len({r // 8 for r in group})


def test_ep_all_to_all_splits_intra_and_inter_node_traffic() -> None:
    base = {"model__experts": 64, "model__moe_topk": 8, "parallel__tp": 1, "parallel__pp": 1, "parallel__dp": 64,
            "parallel__global_batch": 64, "parallel__micro_batch": 1,
            "hardware__bandwidth_gb_per_s": {"intra": 200, "inter": 20}, "hardware__latency_us": {"intra": 0,
                                                                                                   "inter": 0}}
    inside, across = gpt(**base, parallel__ep=8), gpt(**base, parallel__ep=16)
    payload = 2048 * 8 * 2048 * 2  # a rank's tokens x top-k x hidden x bf16
    assert comm.ep_layer(inside).forward == pytest.approx(2 * payload * 7 / 8 / 200e9)
    # 16 ranks over 2 nodes: 7 peers on NVLink, 8 over IB, concurrently; IB is the slower share
    assert comm.ep_layer(across).forward == pytest.approx(2 * payload * 8 / 16 / 20e9)


def test_tp_payload_is_activations_not_parameters() -> None:
    # seed 002: the TP all-reduce moves tokens x hidden x dtype; doubling the batch doubles it, weights do not
    small, large = gpt(parallel__micro_batch=1), gpt(parallel__micro_batch=2)
    lat = comm.tp_layer(gpt(hardware__latency_us={"intra": 0, "inter": 0}, parallel__micro_batch=1), False)
    assert lat.forward == pytest.approx(2 * 2 * (1 / 2) * 2048 * 2048 * 2 / 150e9)
    assert comm.tp_layer(large, False).forward > 1.9 * comm.tp_layer(small, False).forward - 1e-4


# --- seed 000, P1: TP-shardable runtime overheads --------------------------------------------------------------------

@pytest.mark.parametrize(("case", "safety", "overhead", "tp", "expected_mb"), [
    ("P1-01", 1024, 0, 1, 1024), ("P1-02", 1024, 0, 2, 512), ("P1-03", 0, 2676, 1, 2676),
    ("P1-04", 0, 2676, 2, 1338), ("P1-05", 0, 0, 2, 0), ("P1-06", 3072, 0, 1, 3072),
    ("P1-07", 3072, 2676, 1, 5748),
])
def test_p1_overheads_scale_with_tp(case: str, safety: float, overhead: float, tp: int, expected_mb: float) -> None:
    cfg = reduced(tp=tp, dp=32 // (2 * tp), calibration={"safety_buffer_mb": safety,
                                                          "tp_shardable_overhead_mb": overhead})
    est = estimate(cfg)
    assert all(s.memory.overheads == pytest.approx(expected_mb * MIB) for s in est.stages), case
    without = estimate(reduced(tp=tp, dp=32 // (2 * tp), calibration={"safety_buffer_mb": 0,
                                                                       "tp_shardable_overhead_mb": 0}))
    assert est.peak_memory - without.peak_memory == pytest.approx(expected_mb * MIB)


# --- seed 000, P2: EP and ZeRO sharding of expert states --------------------------------------------------------------

def _expert_states(cfg) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    moe = memory.layer_params(cfg, cfg.model.layers - 1)  # a MoE layer
    return states(cfg, Params(expert=moe.expert))


def test_p2_expert_states_scale_as_one_over_ep_without_zero3_sharding() -> None:
    # P2-02 / P2-03: parameters and gradients halve from EP 2 to 4 and again to 8; the ZeRO-1 optimizer state is
    # sharded over the expert-data-parallel group, whose size times EP is the fixed tp x dp: constant in EP
    by_ep = {ep: _expert_states(reduced(ep=ep, expert_zero3_sharding=False)) for ep in (2, 4, 8)}
    for part in range(2):
        assert by_ep[4][part] == pytest.approx(by_ep[2][part] / 2)
        assert by_ep[8][part] == pytest.approx(by_ep[2][part] / 4)
    assert by_ep[2][2] == pytest.approx(by_ep[4][2]) and by_ep[4][2] == pytest.approx(by_ep[8][2])
    moe = memory.layer_params(reduced(ep=1), 11).expert  # by hand: 12 bytes a parameter over the 16 ranks tp x dp
    assert by_ep[2][2] == pytest.approx(moe * 12 / 16)
    assert _expert_states(reduced(ep=2, zero=0))[2] == pytest.approx(moe / 2 * 12)  # no ZeRO: EP alone splits it
    # and so does each config's peak: the seed's measured EP2 -> EP4 -> EP8 steps (885 MB, 442 MB) halve too
    peaks = {ep: estimate(reduced(ep=ep)).peak_memory for ep in (2, 4, 8)}
    assert (peaks[2] - peaks[4]) == pytest.approx(2 * (peaks[4] - peaks[8]))


def test_p2_zero3_sharding_cancels_ep_like_the_old_estimator() -> None:
    # P2-01: with expert_zero3_sharding (and ZeRO-3), EP's split is undone by the expert-DP shard: constant in EP
    by_ep = [_expert_states(reduced(ep=ep, zero=3, expert_zero3_sharding=True)) for ep in (2, 4, 8)]
    assert by_ep[0] == pytest.approx(by_ep[1]) and by_ep[1] == pytest.approx(by_ep[2])


def test_p2_flag_leaves_shared_and_dense_states_alone_and_needs_zero() -> None:
    on, off = reduced(zero=3, expert_zero3_sharding=True), reduced(zero=3, expert_zero3_sharding=False)
    layer = memory.layer_params(on, on.model.layers - 1)
    assert states(on, Params(dense=layer.dense)) == states(off, Params(dense=layer.dense))  # P2-05 / P2-06
    plain_on, plain_off = reduced(zero=0, expert_zero3_sharding=True), reduced(zero=0, expert_zero3_sharding=False)
    assert _expert_states(plain_on) == _expert_states(plain_off)  # P2-07: without ZeRO the flag changes nothing


# --- seed 000, P3 and P4: EP time in seconds, and EP hiding in the pipeline bubble ----------------------------------

def test_p3_ep_hidden_in_the_bubble_lowers_pp_wait_more_as_ep_grows() -> None:
    def pp_wait(ep: int, ratio: float) -> float:
        est = estimate(reduced(ep=ep, calibration={"ep_bubble_overlap_ratio": ratio}))
        return sum(s.pp_wait for s in est.stages)

    eps = (2, 4, 8)
    ep_time = [sum(s.ep_wait for s in estimate(reduced(ep=ep)).stages) for ep in eps]
    assert ep_time == sorted(ep_time)  # a wider all-to-all sends (ep-1)/ep of the tokens
    serial = [pp_wait(ep, 0.0) for ep in eps]
    hidden = [pp_wait(ep, 1.0) for ep in eps]
    assert serial[0] <= serial[1] <= serial[2]  # P3-02: EP as serial work only grows the bubble (seed 000 §2.3)
    saved = [a - b for a, b in zip(serial, hidden, strict=True)]
    assert 0 < saved[0] < saved[1] < saved[2]  # P3-01: the all-to-all fills waits, more of them as EP grows
    # The simulator hides EP only inside real waits (1F1B has them in warm-up and cool-down), so unlike seed 000's
    # closed form (every micro-batch's EP off the critical path) PP_WAIT itself need not fall as EP grows.


def test_p3_ratio_is_inert_without_ep_and_dp_traffic_counts() -> None:
    dense = gpt(calibration__overlap={"dp": 0.5})
    a = estimate(dense)
    b = estimate(dataclasses.replace(dense, calibration=dataclasses.replace(dense.calibration,
                                                                             ep_bubble_overlap_ratio=1.0)))
    assert a.step_s == b.step_s  # P3-03
    assert all(s.dp_wait > 0 for s in a.stages)  # P3-04: no zeroed DP term; it is in TOTAL
    assert all(s.total == pytest.approx(sum(getattr(s, d) for d in DIMENSIONS)) for s in a.stages)


def test_p4_ep_wait_is_seconds_of_payload_over_bandwidth() -> None:
    cfg = reduced(ep=8, calibration={"ep_bubble_overlap_ratio": 0.0})
    est = estimate(cfg)
    # by hand: 4096 tokens x top-4 x 1024 x 2 B to 7 of 8 peers on NVLink (ep within a node), 4 all-to-alls per MoE
    # layer and micro-batch, less the shared expert's forward under the dispatch (and twice that backward)
    a2a = 4096 * 4 * 1024 * 2 * 7 / 8 / 160e9 + 7 * 5e-6
    shared = compute.seconds(compute.moe_parts(cfg)[1], cfg)
    per_layer = 4 * a2a - 3 * min(a2a, shared) if shared < a2a else 2 * a2a
    last = est.stages[-1]
    assert last.ep_wait == pytest.approx(cfg.micro_batches * 6 * per_layer, rel=1e-9)  # P4-01
    assert all(s.ep_wait < 0.5 * s.total for s in est.stages)  # P4-02


def test_p4_without_ep_there_is_no_ep_wait() -> None:
    est = estimate(gpt())
    assert all(s.ep_wait == 0 for s in est.stages)  # P4-04


# --- the assembled step -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "vpp"), [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
def test_bubble_matches_the_closed_form_for_equal_stages(kind: str, vpp: int) -> None:
    # no embedding/head weight to speak of (vocab 64), no DP, no TP: stages are equal
    cfg = gpt(model__vocab=64, model__layers=32, parallel__tp=1, parallel__dp=1, parallel__pp=4,
              parallel__global_batch=32,
              parallel__vpp=vpp, schedule__kind=kind, hardware__latency_us={"intra": 0, "inter": 0},
              hardware__bandwidth_gb_per_s={"intra": 1e9, "inter": 1e9})
    est = estimate(cfg)
    m, p = cfg.micro_batches, 4
    for s in est.stages:  # 0.5%: the 64-word output layer still makes the last stage 0.03% slower, m times over
        assert s.pp_wait / s.comp == pytest.approx((p - 1) / (vpp * m), rel=5e-3)


def test_columns_sum_to_total_and_the_store_rows_sum_exactly() -> None:
    est = estimate(load(ROOT / "examples" / "deepseek_v3.yaml"))
    for s in est.stages:
        assert s.total == pytest.approx(sum(getattr(s, d) for d in DIMENSIONS), rel=1e-12)
    for row in record.stage_rows(est):
        waits = sum(int(row[f"{d}_ns"]) for d in DIMENSIONS)  # type: ignore[call-overload]
        assert waits == row["total_ns"]
        assert row["pp_wait_ns"] >= 0  # type: ignore[operator]


def test_ap_pp_01_03_per_stage_time_and_memory_and_micro_batch_trend() -> None:
    fractions = []
    for m in (4, 8, 16):
        est = estimate(gpt(parallel__pp=4, parallel__dp=1, parallel__global_batch=2 * m))
        assert len(est.stages) == 4 and all(s.memory.peak > 0 and s.comp > 0 for s in est.stages)
        fractions.append(est.stages[0].pp_wait / est.step_s)
    assert fractions[0] > fractions[1] > fractions[2]


def test_ap_pp_04_a_stage_over_the_limit_is_named_with_its_excess() -> None:
    est = estimate(gpt(hardware__hbm_gb=2, parallel__pp=4, parallel__dp=1, parallel__global_batch=16))
    assert not est.fits
    frame = est.memory_frame
    over = frame.filter(~frame["fits"])
    assert over["stage"].to_list()[0] == 0  # 1F1B's first stage holds the most micro-batches
    assert (over["headroom_gib"] < 0).all()


def test_ap_pp_09_recompute_trades_activation_memory_for_compute() -> None:
    runs = {kind: estimate(gpt(schedule__recompute={"kind": kind})) for kind in ("none", "selective", "full")}
    acts = [runs[k].stages[0].memory.activations for k in ("none", "selective", "full")]
    comp = [runs[k].stages[0].comp for k in ("none", "selective", "full")]
    assert acts[0] > acts[1] > acts[2] and comp[0] < comp[1] < comp[2]
    partial = estimate(gpt(schedule__recompute={"kind": "full", "layers": [0, 1]}))
    assert acts[2] < partial.stages[0].memory.activations < acts[0]


def test_ppb_partition_is_more_balanced_than_the_even_split() -> None:
    # a large vocabulary makes the last stage heavy; PPB moves layers off it (AP-PP-02/07 through the estimator)
    even = gpt(model__vocab=256000, parallel__pp=4, parallel__dp=1, parallel__global_batch=16)
    balanced = dataclasses.replace(even, schedule=dataclasses.replace(even.schedule, stage_layers="ppb"))
    partition = ppb(balanced)
    assert partition.is_feasible and sum(partition.stage_partition) == 8
    assert partition.stage_partition[-1] < 2
    assert estimate(balanced).step_s < estimate(even).step_s
    assert lower_bound(balanced, list(partition.stage_partition)) <= estimate(balanced).step_s


def test_ap_pp_11_timeline_frame_plot_and_trace(tmp_path: Path) -> None:
    est = estimate(load(ROOT / "examples" / "m3_512_h100.yaml"))
    frame = timeline.frame(est)
    assert {"F", "B", "TP", "EP", "BUBBLE", "DP"} <= set(frame["kind"].to_list())
    for stage in range(4):  # every stage's intervals tile the step without overlap
        rows = frame.filter((frame["stage"] == stage) & (frame["kind"] != "P2P")).sort("start_ms")
        assert rows["start_ms"][0] == pytest.approx(0, abs=1e-6)
        assert (rows["start_ms"][1:] - rows["end_ms"][:-1]).abs().max() < 1e-6  # type: ignore[operator]
        assert rows["end_ms"][-1] == pytest.approx(est.step_s * 1e3)
    timeline.plot(est, tmp_path / "gantt.png")
    timeline.chrome_trace(est, tmp_path / "trace.json")
    assert (tmp_path / "gantt.png").stat().st_size > 10_000
    import json

    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["cat"] for e in events if e["ph"] == "X"} >= {"F", "B", "EP", "TP"}


def test_seed_000_runs_each_estimate() -> None:
    for run in load_runs(ROOT / "examples" / "deepseek_v3_reduced.yaml"):
        assert estimate(run.config).fits
