"""The estimator against measured and published numbers (../shared/validation, seeds 000 and 001).

Each table is predicted with ONE calibration, the one in its examples/*_calibrated.yaml (the file says how it was
chosen); the rows only change the model, the parallel layout, the schedule and the batch.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from traceana.estimator import comm, compute, memory
from traceana.estimator.config import Config, load, load_runs
from traceana.estimator.estimate import estimate

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
EXAMPLES = ROOT / "examples"


def _with(cfg: Config, model: dict[str, Any], parallel: dict[str, Any], schedule: dict[str, Any]) -> Config:
    recompute = schedule.pop("recompute", None)
    sched = dataclasses.replace(cfg.schedule, **schedule)
    if recompute is not None:
        sched = dataclasses.replace(sched, recompute=dataclasses.replace(sched.recompute, kind=recompute))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model),
                               parallel=dataclasses.replace(cfg.parallel, **parallel), schedule=sched)


def _mape(pred: list[float], meas: list[float]) -> float:
    return 100 * sum(abs(p - m) / m for p, m in zip(pred, meas, strict=True)) / len(meas)


def _pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_korthikanti_table_5_beats_calculon() -> None:
    base = load(EXAMPLES / "korthikanti2022_calibrated.yaml")
    pred, meas = [], []
    with open(SHARED / "validation" / "korthikanti2022_table5.csv") as handle:
        for row in csv.DictReader(handle):
            h, v = int(row["hidden"]), int(row["virtual_stages"])
            cfg = _with(base,
                        {"layers": int(row["layers"]), "hidden": h, "ffn_hidden": 4 * h, "heads": int(row["heads"]),
                         "seq_len": int(row["seq_len"]), "vocab": int(row["vocab"])},
                        {"tp": int(row["tp"]), "pp": int(row["pp"]), "dp": int(row["dp"]), "vpp": v,
                         "sequence_parallel": row["sequence_parallel"] == "true",
                         "micro_batch": int(row["micro_batch"]), "global_batch": int(row["global_batch"])},
                        {"kind": "interleaved" if v > 1 else "1f1b", "recompute": row["recompute"]})
            pred.append(estimate(cfg).step_s)
            meas.append(float(row["measured_iteration_s"]))
    errors = [abs(p - m) / m * 100 for p, m in zip(pred, meas, strict=True)]
    print(f"\nKorthikanti Table 5: MAPE {_mape(pred, meas):.2f}%, max {max(errors):.2f}% "
          f"(Calculon 3.65% / 8.87%); rows {[f'{e:.1f}' for e in errors]}")
    assert len(pred) == 8
    assert _mape(pred, meas) < 3.65 and max(errors) < 8.87


def test_megatron_h100_weak_scaling_small_models_no_longer_far_too_fast() -> None:
    """NVIDIA's nine-model H100 table (tests/data/megatron_h100_weak_scaling.csv, transcribed from the Megatron-LM
    README; nothing was fitted to it): per-GPU TFLOP/s as Megatron counts them (72·B·s·L·h²·(1 + s/6h + V/12Lh)
    over the step) predicted from each row's model and layout with the built-in h100 profile, overlaps on as the
    README says. Before this round: MAPE 17.3% without the overlaps, 28.6% with them, the 1.7B row 71% fast."""
    base = load(EXAMPLES / "megatron_h100_weak_scaling.yaml")
    with open(ROOT / "tests" / "data" / "megatron_h100_weak_scaling.csv") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    pred, meas = [], []
    for row in rows:
        h, layers, tp, pp, dp, batch = (int(row[k]) for k in ("hidden", "layers", "tp", "pp", "dp", "global_batch"))
        cfg = _with(base, {"layers": layers, "hidden": h, "ffn_hidden": 4 * h, "heads": int(row["heads"])},
                    {"tp": tp, "pp": pp, "dp": dp, "global_batch": batch, "sequence_parallel": tp > 1,
                     "tp_comm_overlap": tp > 1}, {})
        s, v = cfg.model.seq_len, cfg.model.vocab
        flops = 72 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
        pred.append(flops / estimate(cfg).step_s / cfg.parallel.world_size / 1e12)
        meas.append(float(row["tflops_per_gpu"]))
    errors = [(p - m) / m * 100 for p, m in zip(pred, meas, strict=True)]
    print(f"\nMegatron H100 weak scaling: MAPE {_mape(pred, meas):.1f}%, r {_pearson(pred, meas):.2f}; "
          f"rows {[f'{e:+.0f}' for e in errors]}")
    assert len(pred) == 9
    assert _mape(pred, meas) < 13.0
    assert max(abs(e) for e in errors) < 35.0  # the 1.7B row: +33%, was +71%
    assert _pearson(pred, meas) > 0.3


def _vtrain_rows(path: Path = SHARED / "validation" / "vtrain_ground_truth_single_node.csv") -> list[dict[str, str]]:
    """vTrain's measured runs by column name (the single-node file's header starts with '#', the multi-node file's
    comment lines do)."""
    with open(path, encoding="utf-8-sig") as handle:
        header = "iteration time (ms)"
        return list(csv.DictReader(line for line in handle if not line.startswith("#") or header in line))


def _vtrain_predictions(base: Config, rows: list[dict[str, str]] | None = None) -> tuple[list[float], list[float]]:
    pred, meas = [], []
    for row in rows or _vtrain_rows():
        gb, mb, h, heads, layers, seq, tp, dp, pp = (int(row[k]) for k in (
            "global batch", "micro batch", "hidden size", "attention heads", "# layers", "sequence length",
            "tensor parallelism", "data parallelism", "pipeline parallelism"))
        cfg = _with(base, {"layers": layers, "hidden": h, "ffn_hidden": 4 * h, "heads": heads, "seq_len": seq},
                    {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "global_batch": gb}, {})
        pred.append(estimate(cfg).step_s * 1e3)
        meas.append(float(row["iteration time (ms)"]))
    return pred, meas


def test_vtrain_single_node_with_the_a100_profile() -> None:
    """Shape-aware compute (the built-in A100 profile) and four calibrated host / latency knobs (the example says
    which): the issue's bar is MAPE <= 8% with r >= 0.97, on all rows and on the held-out half."""
    pred, meas = _vtrain_predictions(load(EXAMPLES / "vtrain_a100_profile.yaml"))
    held_out = (pred[1::2], meas[1::2])
    print(f"\nvTrain, A100 profile: MAPE {_mape(pred, meas):.2f}%, r {_pearson(pred, meas):.4f}; held-out MAPE "
          f"{_mape(*held_out):.2f}%, r {_pearson(*held_out):.4f}")
    assert _mape(pred, meas) <= 8 and _pearson(pred, meas) >= 0.97
    assert _mape(*held_out) <= 8 and _pearson(*held_out) >= 0.97


def test_vtrain_multi_node_runs_held_out() -> None:
    """vTrain's 109 multi-node runs (tests/data/vtrain_ground_truth_multi_node.csv: 3.6B-175B GPT on 64-512 A100,
    8 a node) with the single-node example as it is: its host and latency knobs were chosen on single-node rows,
    the cross-node links are the A100 profile's data-sheet NIC; nothing was fitted to these rows."""
    pred, meas = _vtrain_predictions(load(EXAMPLES / "vtrain_a100_profile.yaml"),
                                     _vtrain_rows(ROOT / "tests" / "data" / "vtrain_ground_truth_multi_node.csv"))
    print(f"\nvTrain multi-node, A100 profile: {len(pred)} rows, MAPE {_mape(pred, meas):.2f}%, "
          f"r {_pearson(pred, meas):.4f}")
    assert len(pred) == 109
    assert _mape(pred, meas) <= 10 and _pearson(pred, meas) >= 0.98


def test_vtrain_single_node_one_calibration() -> None:
    pred, meas = _vtrain_predictions(load(EXAMPLES / "vtrain_calibrated.yaml"))
    held_out = (pred[1::2], meas[1::2])  # the calibration was chosen on the even rows
    print(f"\nvTrain: {len(pred)} rows, MAPE {_mape(pred, meas):.2f}%, r {_pearson(pred, meas):.4f}; held-out rows "
          f"MAPE {_mape(*held_out):.2f}%, r {_pearson(*held_out):.4f}")
    assert len(pred) == 1440
    assert _pearson(pred, meas) >= 0.9 and _mape(pred, meas) <= 15
    assert _pearson(*held_out) >= 0.9 and _mape(*held_out) <= 15


# --- seed 001's worked examples: the per-operation numbers the article derives, from the same inputs --------------

def test_seed_001_m3_on_512_h100() -> None:
    cfg = load(EXAMPLES / "m3_512_h100.yaml")
    est = estimate(cfg)
    tokens = compute.tokens(cfg)
    # TP all-reduce of B·T·d·2 = 201 MB over 4 NVLink ranks at 360 GB/s: the article's 0.84 ms (+ 6 latency steps)
    assert tokens * 6144 * 2 == pytest.approx(201e6, rel=0.01)
    assert comm.collective("all_reduce", tokens * 6144 * 2, comm.span(cfg, ("tp",)), cfg) == pytest.approx(
        0.84e-3, rel=0.05)
    # the EP group (stride tp=4 in the expert order) spans 4 nodes, as the article argues (CH 7.5)
    assert comm.span(cfg, ("ep",), expert=True).nodes == 4
    # One dispatch: each rank sends its 4096 (sequence-parallel) tokens x top-8 x 6144 x 2 B, of which 6/8 go off
    # node at the article's 20 GB/s effective all-to-all: 15.1 ms. The article's 17.6 ms is 352 MB (B·T·d·2 x
    # 2·7/8, no top-k, counted as one dispatch) / 20 GB/s.
    one = comm.ep_layer(cfg).forward / 2
    assert one == pytest.approx(4096 * 8 * 6144 * 2 * 6 / 8 / 20e9 + 7 * 10e-6, rel=1e-6)
    # The step: the article adds EP for 2 forward all-to-alls per MoE layer (493 ms/μB); the model also counts the
    # backward's two and the full recompute's two (3x), and since the all-to-alls are serial inside each stage's
    # passes, the interleaved bubble grows with them: ~10 s against the article's 2.9 s.
    busiest = max(est.stages, key=lambda s: s.ep_wait)
    assert busiest.ep_wait > 0.5 * est.step_s  # EP is the #1 cost, as the article concludes (67%)
    assert 2.9 < est.step_s / 2.938 < 4.0


def test_seed_001_dense_70b_fsdp2() -> None:
    cfg = load(EXAMPLES / "dense70b_fsdp2_32_h100.yaml")
    est = estimate(cfg)
    (stage,) = est.stages
    # per-layer all-gather of 0.875B params x 2 B over the 8-GPU shard at 360 GB/s: the article's 1.53 GB / 4.2 ms
    layer = memory.layer_params(cfg, 0)
    gather = comm.zero3_layer(cfg, layer.dense).forward
    assert layer.dense * 2 * 7 / 8 == pytest.approx(1.53e9, rel=0.03)
    assert gather == pytest.approx(4.2e-3, rel=0.03)
    # prefetch hides every gather behind a 40+ ms layer: DP_WAIT is one first gather plus the replica all-reduce's
    # unhidden 10%; the article's 13 ms assumes 70B/32 bf16 gradients, the model all-reduces each replica's
    # 1/8 shard in fp32 (70B/8 x 4 B over 4 nodes at 50 GB/s: 1.06 s, 10% exposed)
    layer_fwd = est.costs[0].forward / cfg.model.layers
    assert layer_fwd > 5 * gather
    shard_ar = 2 * 3 / 4 * memory.device_params(cfg, est.chunks)[0].dense / 8 * 4 / 50e9
    assert stage.dp_wait == pytest.approx(gather + 0.1 * shard_ar, rel=0.01)
    # compute: the article's 80 x (37 + 74) ms x 1.3 = 11.5 s; the model's forward is 43.8 ms a layer (it adds the
    # attention projections and elementwise kernels) and full recompute costs one more forward (x 4/3): 14.1 s
    # (within 2%: the output layer and the optimizer step)
    assert stage.comp == pytest.approx(80 * 4 * layer_fwd, rel=0.02)
    assert 1.1 < est.step_s / 11.561 < 1.3


def test_seed_001_dense_70b_megatron_tp4_pp2() -> None:
    cfg = load(EXAMPLES / "dense70b_megatron_tp4pp2_32_h100.yaml")
    est = estimate(cfg)
    tokens = compute.tokens(cfg)
    # TP all-reduce 2·(3/4)·268 MB at 360 GB/s: the article's 403 MB, 1.1 ms; PP p2p 268 MB over IB: 5.4 ms
    assert comm.collective("all_reduce", tokens * 8192 * 2, comm.span(cfg, ("tp",)), cfg) == pytest.approx(
        1.1e-3, rel=0.05)
    assert est.p2p_s == pytest.approx(5.4e-3, rel=0.01)
    # per-layer forward ~12 ms with TP4 (the article: FFN 8 + attention 5 = 13 ms)
    assert est.costs[0].forward / 40 == pytest.approx(13e-3, rel=0.1)
    # With one micro-batch per pipeline nothing overlaps: stage 0 idles through all of stage 1's passes, so the
    # bubble is a whole stage, not the article's (p-1)/(v·m) = 1/2 (which needs m >= p; interleaving needs m % p == 0)
    first, second = est.stages
    busy_second = second.comp + second.mp_wait - est.optimizer[1]
    assert first.pp_wait == pytest.approx(busy_second + 2 * est.p2p_s + (second.dp_wait - first.dp_wait), rel=0.02)
    assert 1.4 < est.step_s / 2.909 < 1.7


# --- seed 000's six DeepSeek-V3-reduced configs ------------------------------------------------------------------

def test_seed_000_peak_memory_with_the_proposed_overheads() -> None:
    runs = load_runs(EXAMPLES / "deepseek_v3_reduced.yaml")
    ratios = {}
    for run in runs:
        est = estimate(run.config)
        ratios[run.name] = est.peak_memory / memory.MIB / run.measured["peak_memory_mb"]
    print("\nseed 000 estimate/measured peak:", {k: round(v, 3) for k, v in ratios.items()})
    # seed 000's goal for P1 (§3.1 / INT-01): every ratio in 0.85-1.10, TP1 no longer far below TP2
    assert all(0.85 <= r <= 1.10 for r in ratios.values())
    tp1 = [ratios[n] for n in "ABC"]
    tp2 = [ratios[n] for n in "DEF"]
    assert abs(sum(tp1) / 3 - sum(tp2) / 3) < 0.05


def test_seed_000_expert_memory_falls_as_one_over_ep() -> None:
    by_name = {run.name: estimate(run.config) for run in load_runs(EXAMPLES / "deepseek_v3_reduced.yaml")}
    # measured: A-B = 885 MB, B-C = 442 MB (TP1); E-D = 885 MB, D-F = 442 MB (TP2): halving steps, as 1/EP gives
    step = {pair: (by_name[pair[0]].peak_memory - by_name[pair[1]].peak_memory) / memory.MIB
            for pair in ("AB", "BC", "ED", "DF")}
    assert step["AB"] == pytest.approx(2 * step["BC"], rel=1e-6)
    assert step["ED"] == pytest.approx(2 * step["DF"], rel=1e-6)
    # the slope is predicted, not fitted (the experts' size comes from the seed's ~1.3B parameters): 756 MB against
    # 885. Expert optimizer state split by EP as well (18 bytes a parameter, not 6) would make it 2,268 MB.
    assert step["AB"] == pytest.approx(885, rel=0.15) and step["BC"] == pytest.approx(442, rel=0.15)
