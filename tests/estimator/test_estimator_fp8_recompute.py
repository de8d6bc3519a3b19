"""FP8 matmuls and activations, and recompute module lists, against hand-computed FLOPs, seconds and bytes."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import job_config
from traceana.errors import TraceanaError
from traceana.estimator import compute, memory
from traceana.estimator.config import from_dict, load
from traceana.estimator.estimate import estimate

ROOT = Path(__file__).resolve().parents[2]
GPT: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 4096, "ffn_hidden": 16384, "heads": 32, "vocab": 51200, "seq_len": 2048,
              "gated_mlp": False},
    "parallel": {"tp": 2, "micro_batch": 1, "global_batch": 8, "sequence_parallel": True},
    "hardware": {"peak_tflops_bf16": 1000, "peak_tflops_fp8": 2000, "hbm_gb": 80},
    "calibration": {"matmul_efficiency": 0.5},
}


def gpt(**sections: dict[str, Any]) -> compute.Config:
    return job_config(GPT, **sections)


def test_fp8_mlp_runs_below_the_fp8_peak_and_pays_its_casts() -> None:
    hbm = {**GPT["hardware"], "hbm_bandwidth_gb_per_s": 2000}
    base, fp8 = gpt(hardware=hbm), gpt(hardware=hbm, precision={"fp8": ["mlp"]})
    t, h, tp = 2048, 4096, 2
    mlp_flops = 2 * 2 * t * h * 4 * h / tp  # fc1 and fc2 forward on one GPU
    speedup = 2.0 * (1550 / 1979) / (830 / 989)  # DeepGEMM's FP8 share of its peak over the H200 sweep's bf16 one
    # by hand: the weight gradients (no cast of their own) save the MLP's FLOPs at 1 - 1 / 1.87
    saved = compute.layer_seconds(base, 0).wgrad - compute.layer_seconds(fp8, 0).wgrad
    assert saved == pytest.approx(mlp_flops * (1 - 1 / speedup) / (1000e12 * 0.5), rel=1e-9)
    # the forward pays the casts of fc1's and fc2's inputs (t x h, t x 4h over TP) and weights (4h x h over TP,
    # once a step: the batch's micro-batches share it), 4 bytes an element at the memory bandwidth
    micro = base.micro_batches
    cast = 4 * (t * h + h * 4 * h / tp / micro + t * 4 * h / tp + 4 * h / tp * h / micro)
    forward = compute.layer_seconds(base, 0).forward - compute.layer_seconds(fp8, 0).forward
    assert compute.traffic_seconds(cast, base) > 0
    assert forward == pytest.approx(mlp_flops * (1 - 1 / speedup) / (1000e12 * 0.5)
                                    - compute.traffic_seconds(cast, base), rel=1e-9)
    # FLOPs (MFU's numerator) do not change with the precision
    assert compute.layer(fp8, 0) == compute.layer(base, 0)


def test_fp8_with_a_profile_runs_the_products_it_names_1_87_times_faster() -> None:
    h100 = {"profile": "h100", "peak_tflops_bf16": 989, "peak_tflops_fp8": 1979, "hbm_gb": 80}
    base = gpt(hardware=h100)
    fp8 = gpt(hardware=h100, precision={"fp8": ["attention", "mlp", "head"]})
    ratio = 1 / (1979 / 989 * (1550 / 1979) / (830 / 989))
    assert compute.gemm_seconds(compute.layer_gemms(fp8, 0), fp8).forward == pytest.approx(
        ratio * compute.gemm_seconds(compute.layer_gemms(base, 0), base).forward, rel=1e-9)
    assert compute.gemm_seconds(compute.head_gemms(fp8), fp8).wgrad == pytest.approx(
        ratio * compute.gemm_seconds(compute.head_gemms(base), base).wgrad, rel=1e-9)


def test_fp8_activations_keep_linear_inputs_in_one_byte() -> None:
    base, fp8 = gpt(), gpt(precision={"fp8_activations": True})
    t, h, tp = 2048, 4096, 2
    # linear inputs: the two norms' outputs (t·h/tp each with sequence parallelism) and fc2's input (t·4h/tp), each
    # 1 byte instead of 2; the output projection's input (t·h/tp) in DeepSeek's E5M6, 1.5 bytes
    saved = 2 * t * h / tp + t * 4 * h / tp + 0.5 * t * h / tp
    assert memory.layer_activation_bytes(base, 0) - memory.layer_activation_bytes(fp8, 0) == pytest.approx(saved)
    no_dropout = gpt(model={**GPT["model"], "dropout": False})  # the two blocks' 1-byte masks, t·h/tp each
    assert memory.layer_activation_bytes(base, 0) - memory.layer_activation_bytes(no_dropout, 0) == pytest.approx(
        2 * t * h / tp)


def test_deepseek_v3_fits_80_gib_with_its_own_recipe_counted_by_hand() -> None:
    """examples/deepseek_v3_dualpipe.yaml, device 1 (chunks 1 and 14 under DualPipe: layers 3-6 and 53-56, all MoE),
    every term from the report's numbers (arXiv 2412.19437 §2, §3.2, §3.3) and nothing fitted."""
    cfg = load(ROOT / "examples" / "deepseek_v3_dualpipe.yaml")
    t, h = 4096, 7168
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert mla == 187_105_280
    dense = mla + 4 * h + 3 * h * 2048 + h * 256  # norms, the shared expert, the router
    expert = 256 // 64 * 3 * h * 2048  # EP 64: 4 of the 256 routed experts a layer
    layers = 8
    est = estimate(cfg)
    device = est.stages[1].memory
    assert device.params == pytest.approx(layers * (dense + expert) * 2)  # bf16 weights, both DualPipe chunks
    assert device.grads == pytest.approx(layers * (dense + expert) * 4)  # fp32 gradients, ZeRO-1 leaves them whole
    # fp32 master weights and BF16 moments (§3.3.4: 4 + 2 + 2 bytes), over DP 128 dense and edp = 128 / 64 experts
    assert device.optimizer == pytest.approx(layers * 8 * (dense / 128 + expert / 2))
    # per MoE layer and micro-batch (t tokens, no dropout): the two RMSNorms' bf16 inputs, the MLA latents (the
    # up-projections and norms recomputed, §3.2.3), the attention output in E5M6, each of the t·8 routed copies'
    # FP8 input and FP8 SwiGLU inputs (§3.3.2, the SwiGLU output recomputed and scaled there), the shared expert's
    per_layer = 2 * t * h * 2 + 2 * t * (1536 + 512 + 64) + 1.5 * t * 128 * 128 + t * 8 * (h + 2 * 2048) \
        + t * 2 * 2048
    assert device.activations == pytest.approx(17 * 4 * per_layer)  # DualPipe keeps PP + 1 = 17 chunks (Table 2)
    assert est.peak_memory / memory.GIB < 80 and all(s.fits for s in est.stages)
    # what the report's recipe saves, each named: with the combine's BF16 expert outputs kept it does not fit
    combine = load(ROOT / "examples" / "deepseek_v3_dualpipe.yaml")
    combine = dataclasses.replace(combine, model=dataclasses.replace(combine.model, moe_weighting="combine"))
    assert estimate(combine).stages[1].memory.activations - device.activations == pytest.approx(
        17 * 4 * t * 8 * h * 2)
    assert estimate(combine).peak_memory / memory.GIB > 80
    # reserved: the largest transient tensor, the routed copies' dispatch buffer (t x 8 x h, bf16) in 2 MiB
    # segments; used adds NCCL's buffers, 4 MiB per channel and peer: the rings of dp 128 (2 peers) and edp 2 (1)
    # on 16 channels, the all-to-all's 63 peers and the pipeline's 2 on 2 channels, and the 500 MiB context
    reserved, used = memory.reserved_and_used(cfg, est.chunks, [s.memory.peak for s in est.stages])[1]
    assert reserved - device.peak == pytest.approx(math.ceil(t * 8 * h * 2 / 2**21) * 2**21)
    assert used - reserved == pytest.approx(((2 + 1) * 16 + 2 * (63 + 2)) * 4 * 2**20 + 500 * 2**20)
    assert used / memory.GIB < 80  # the H800's 80 GB hold the device's whole use too


def test_recompute_modules_trade_bytes_for_work() -> None:
    t, h, tp, a = 2048, 4096, 2, 2
    selective = gpt(schedule={"recompute": {"kind": "selective"}})
    norms = gpt(schedule={"recompute": {"kind": "selective", "modules": ["layernorm"]}})
    act = gpt(schedule={"recompute": {"kind": "selective", "modules": ["activation"]}})
    kept = memory.layer_activation_bytes
    # the default list is the attention core: FlashAttention keeps no scores, so only work differs from none
    none = gpt()
    assert kept(selective, 0) == kept(none, 0)
    assert compute.layer(selective, 0).recompute == pytest.approx(compute.attention(selective)[1])
    # norms: their outputs (2 per layer, t·h/tp a byte x 2 with sequence parallelism) are not kept; the recompute
    # moves their bytes again (read + write) and repeats no FLOPs
    assert kept(none, 0) - kept(norms, 0) == pytest.approx(2 * a * t * h / tp)
    assert compute.layer_traffic(norms, 0).recompute == pytest.approx(2 * 2 * a * t * h / tp)
    assert compute.layer(norms, 0).recompute == 0
    # the GeLU output (fc2's input, t·4h/tp) is not kept; recomputing it reads fc1's output and writes it again
    assert kept(none, 0) - kept(act, 0) == pytest.approx(a * t * 4 * h / tp)
    assert compute.layer_traffic(act, 0).recompute == pytest.approx(2 * a * t * 4 * h / tp)


def test_mla_up_projection_recompute() -> None:
    raw = load(ROOT / "examples" / "deepseek_v3_reduced.yaml")
    m, p = raw.model, raw.parallel
    base = from_dict({"model": {k: getattr(m, k) for k in ("layers", "hidden", "ffn_hidden", "heads", "vocab",
                                                          "seq_len", "q_lora_rank", "kv_lora_rank",
                                                          "qk_rope_head_dim", "head_dim", "v_head_dim")},
                      "parallel": {"tp": p.tp, "global_batch": 1},
                      "schedule": {"recompute": {"kind": "selective", "modules": ["mla_up_proj"]}},
                      "hardware": {"peak_tflops_bf16": 989, "hbm_gb": 80}}, "mla.yaml")
    t, qk, v = compute.tokens(base), m.hd + m.qk_rope_head_dim, m.v_head_dim or m.hd
    up = 2 * t * (m.q_lora_rank * m.heads * qk + m.kv_lora_rank * m.heads * (m.hd + v)) / p.tp
    assert compute.layer(base, 0).recompute == pytest.approx(up, rel=1e-12)


@pytest.mark.parametrize(("section", "message"), [
    ({"schedule": {"recompute": {"kind": "full", "modules": ["layernorm"]}}},
     "gpt.yaml: schedule.recompute.modules needs kind: selective (kind is full)"),
    ({"schedule": {"recompute": {"kind": "selective", "modules": ["norms"]}}},
     "gpt.yaml: schedule.recompute.modules: 'norms': choose from core_attn, layernorm, activation, mla_up_proj"),
    ({"schedule": {"recompute": {"kind": "selective", "modules": ["mla_up_proj"]}}},
     "gpt.yaml: schedule.recompute.modules: mla_up_proj needs an MLA model (model.kv_lora_rank)"),
    ({"precision": {"fp8": ["everything"]}}, "gpt.yaml: precision.fp8: 'everything': choose from attention, mlp"),
    ({"model": {**GPT["model"], "moe_weighting": "both"}},
     "gpt.yaml: model.moe_weighting='both': choose one of combine, swiglu"),
    ({"calibration": {"nccl_channels": -1}}, "gpt.yaml: calibration.nccl_channels=-1: must be >= 0"),
])
def test_bad_fp8_and_recompute_fields_are_named(section: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceanaError, match=re.escape(message)):
        gpt(**section)
    without_fp8_peak = copy.deepcopy(GPT)
    del without_fp8_peak["hardware"]["peak_tflops_fp8"]
    without_fp8_peak["precision"] = {"fp8": ["mlp"]}
    with pytest.raises(TraceanaError, match=re.escape("precision.fp8 needs hardware.peak_tflops_fp8")):
        from_dict(without_fp8_peak, "gpt.yaml")
