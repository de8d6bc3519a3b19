"""Estimator configs (DESIGN §5) for the sample experiments: sample_traces/configs/<name>.yaml.

    .venv/bin/python sample_traces/configs.py [hardware_cpu.yaml]

The model section describes each toy model as closely as the format allows. The MLP, pipeline and MoE samples have
no attention (``attention: false``), embedding or head; the format always has an embedding and a head, so those
configs use a vocabulary of 8 to keep that extra work small, and say in a comment what differs. Hardware comes
from probe_hardware.py; the matmul efficiency is the per-process rate measured with as many processes as the
experiment has ranks, over the single-process peak.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from generate import EXPERIMENTS

from traceana.layout import Layout

HERE = Path(__file__).resolve().parent
FP32 = {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 0, "activation_bytes": 4}  # fp32, plain SGD

_MLP = {"layers": 1, "hidden": 512, "ffn_hidden": 1024, "heads": 2, "vocab": 8, "seq_len": 128, "gated_mlp": False,
        "attention": False}
# Pipeline stage s computes one GEMM 64x512x1024 and ships [mb, 1024]: hidden 1024 with ffn_hidden 256 gives a layer
# whose MLP has the same FLOPs (2 x 1024 x 256 = 512 x 1024) and parameters (2 MiB) and whose activation is 1024 wide.
# 64 tokens per pipeline = 8 sequences of 8; pp2_mb1 takes them as one micro-batch of 8, pp2_mb4 as 4 of 2,
# pp2_mb8 as 8 of 1.
_PIPE = {"layers": 2, "hidden": 1024, "ffn_hidden": 256, "heads": 1, "vocab": 8, "seq_len": 8, "gated_mlp": False,
         "attention": False}
_MOE = {"layers": 1, "hidden": 512, "ffn_hidden": 2048, "heads": 1, "vocab": 8, "seq_len": 64, "gated_mlp": False,
        "attention": False, "experts": 2, "moe_topk": 1, "expert_ffn_hidden": 2048}

# name -> (model, parallel extras, schedule kind, what the format cannot say)
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any], str, str]] = {
    "tp2dp2_mlp": (_MLP, {"micro_batch": 1, "global_batch": 2}, "1f1b",
                   "no embedding or head in the real model"),
    "tp2dp2_mlp_b256": ({**_MLP, "seq_len": 256}, {"micro_batch": 1, "global_batch": 2}, "1f1b",
                        "no embedding or head in the real model"),
    "tp2dp2_mlp_b512": ({**_MLP, "seq_len": 512}, {"micro_batch": 1, "global_batch": 2}, "1f1b",
                        "no embedding or head in the real model"),
    "tp4_mlp_b256": ({**_MLP, "seq_len": 256, "heads": 4}, {"micro_batch": 1, "global_batch": 1}, "1f1b",
                     "no embedding or head in the real model"),
    "tp2dp2_mlp_sp": (_MLP, {"micro_batch": 1, "global_batch": 2, "sequence_parallel": True}, "1f1b",
                      "no embedding or head; the real model AllGathers right after its ReduceScatter"),
    "pp2_mb1": (_PIPE, {"micro_batch": 8, "global_batch": 16}, "gpipe",
                "each stage is one GEMM, not an MLP's two; no embedding or head"),
    "pp2_mb4": (_PIPE, {"micro_batch": 2, "global_batch": 16}, "gpipe",
                "each stage is one GEMM, not an MLP's two; no embedding or head"),
    "pp2_mb8": (_PIPE, {"micro_batch": 1, "global_batch": 16}, "gpipe",
                "each stage is one GEMM, not an MLP's two; no embedding or head"),
    "moe_balanced": (_MOE, {"micro_batch": 1, "global_batch": 4}, "1f1b",
                     "no router, embedding or head; routing is fixed"),
    # dropless: EP rank 0's expert computes 112 tokens, 1.75 x its balanced 64; EP rank 1's 16, 0.25 x; none padded
    "moe_skewed": ({**_MOE, "expert_load": [1.75, 0.25]}, {"micro_batch": 1, "global_batch": 4}, "1f1b",
                   "as moe_balanced"),
    "toy8_tp2pp2dp2_1f1b": ({"layers": 4, "hidden": 256, "ffn_hidden": 1024, "heads": 4, "vocab": 1024,
                             "seq_len": 128, "gated_mlp": False}, {"micro_batch": 1, "global_batch": 8}, "1f1b",
                            "the LM head is replicated over TP, not vocab-parallel"),
}


def config(name: str, hardware: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The config of one experiment and what it cannot describe."""
    model, extras, schedule, caveat = MODELS[name]
    layout = Layout.parse(EXPERIMENTS[name].layout)
    return render(model, extras, schedule, layout, hardware, layout.world_size), caveat


def render(model: dict[str, Any], extras: dict[str, Any], schedule: str, layout: Layout, hardware: dict[str, Any],
           processes: int) -> dict[str, Any]:
    """A config for ``layout``, its matmul efficiency the GEMM rate the probe measured with ``processes`` at once."""
    rates = hardware["measured"]["gemm_gflop_per_s"][f"{processes}_processes"]
    peak_gflops = hardware["hardware"]["peak_tflops_bf16"] * 1e3
    sizes = {d: getattr(layout, d) for d in ("tp", "pp", "dp", "ep", "cp")}
    return {
        "model": model,
        "parallel": {**sizes, "order": layout.order, **extras},
        "schedule": {"kind": schedule},
        "hardware": {**hardware["hardware"], "devices": layout.world_size},
        # safety_buffer_mb: seed 000's buffer is accelerator allocator fragmentation and runtime workspace; a CPU
        # process has neither.
        "calibration": {**hardware["calibration"], "safety_buffer_mb": 0.0,
                        "matmul_efficiency": round(statistics.median(rates.values()) / peak_gflops, 3)},
        "precision": FP32,
    }


def write(hardware_file: Path) -> list[Path]:
    hardware = yaml.safe_load(hardware_file.read_text())
    folder = HERE / "configs"
    folder.mkdir(exist_ok=True)
    written = []
    for name in MODELS:
        body, caveat = config(name, hardware)
        path = folder / f"{name}.yaml"
        header = (f"# {name}: {EXPERIMENTS[name].summary}\n# layout {EXPERIMENTS[name].layout}; "
                  f"written by sample_traces/configs.py from {hardware_file.name}\n# not modelled: {caveat}\n")
        path.write_text(header + yaml.safe_dump(body, sort_keys=False))
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "hardware_cpu.yaml"):
        print(f"wrote {written_path}")
