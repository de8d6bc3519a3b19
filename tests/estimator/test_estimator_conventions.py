"""Messages that name the field the user wrote, MFU in the conventions papers use, and Llama 3's empty chunks."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from traceana.errors import TraceanaError
from traceana.estimator import compute
from traceana.estimator.config import from_dict
from traceana.estimator.estimate import estimate, model_flops, utilization

LLAMA = {"model": {"layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128, "kv_heads": 8,
                   "vocab": 128256, "seq_len": 8192},
         "parallel": {"tp": 8, "pp": 16, "vpp": 8, "dp": 1, "micro_batch": 1, "global_batch": 16},
         "schedule": {"kind": "interleaved"}, "hardware": {"profile": "h100"}}


def llama(**schedule: Any) -> dict[str, Any]:
    raw = copy.deepcopy(LLAMA)
    raw["schedule"].update(schedule)
    return raw


def test_more_chunks_than_layers_names_pp_and_vpp() -> None:
    with pytest.raises(TraceanaError) as exc:
        from_dict(llama(), "llama.yaml")
    assert str(exc.value) == ("llama.yaml: parallel.pp=16 x parallel.vpp=8 = 128 model chunks but model.layers=126: "
                              "give schedule.stage_layers, one count per chunk, with empty chunks (0) where there are "
                              "fewer layers than chunks")


def test_empty_first_and_last_chunks_as_llama_3() -> None:
    """16 stages x 8 chunks, 126 layers: the first chunk (stage 0) and the last (stage 15) hold none."""
    cfg = from_dict(llama(stage_layers=[0, *[1] * 126, 0]), "llama.yaml")
    est = estimate(cfg)
    assert [s.layers for s in est.stages] == [7, *[8] * 14, 7]
    assert est.chunks[0] == range(0) and est.chunks[-1] == range(126, 126)
    # the empty first chunk still carries the embedding's TP all-reduce, the empty last one the output layer
    assert est.costs[-1].forward > 0 and est.costs[0].tp.forward > 0


def test_mfu_conventions_differ_by_the_masked_half_and_the_recompute() -> None:
    raw = llama(stage_layers=[0, *[1] * 126, 0], recompute={"kind": "full"})
    cfg = from_dict(raw, "llama.yaml")
    est = estimate(cfg)
    u = utilization(est)
    p, m = cfg.parallel, cfg.model
    gpus_work = p.micro_batches * p.tp * p.cp * p.dp
    # by hand: the causal core forward on one GPU is 4·t·s·(heads·hd)/tp, halved by FlashAttention; counting the
    # whole score matrix adds that half again, forward and twice backward, in each of the 126 layers
    t = p.micro_batch * m.seq_len
    half_core = 4 * t * m.seq_len * m.hidden / p.tp / 2
    assert model_flops(cfg, causal_halved=False) - model_flops(cfg) == pytest.approx(
        126 * 3 * half_core * gpus_work, rel=1e-9)
    # full recompute repeats each layer's forward once (the output layer is not recomputed)
    forward = sum(compute.layer(cfg, i).forward for i in range(126))
    assert model_flops(cfg, recompute=True) - model_flops(cfg) == pytest.approx(forward * gpus_work, rel=1e-9)
    capacity = est.step_s * p.world_size * 989e12
    assert u["mfu_causal_attention_halved"] == pytest.approx(model_flops(cfg) / capacity)
    assert u["mfu_causal_attention_halved"] < u["mfu_full_attention"]
    assert u["mfu_causal_attention_halved"] < u["hfu_with_recompute_causal_attention_halved"]
