"""Regenerate the sample traces: seed 002's experiments as real gloo jobs under torch.profiler.

    .venv/bin/python sample_traces/generate.py [--only NAME ...] [--out DIR]

Writes DIR/<experiment>/rank<N>.json.gz (default DIR: sample_traces/traces). Needs torch (`pip install -e .[traces]`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import moe
import pipeline
import toy_transformer
import tp_mlp
from harness import Experiment, launch

# Seed 002's pipeline replicas are rank0 -> rank1 and rank2 -> rank3: pp varies fastest.
PP_LAYOUT = "pp=2,dp=2,order=tp-cp-ep-pp-dp"

EXPERIMENTS = {
    e.name: e
    for e in (
        Experiment("tp2dp2_mlp", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_allreduce,
                   "TP2xDP2 two-layer MLP, row-parallel output AllReduce"),
        Experiment("tp2dp2_mlp_b256", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_allreduce_b256,
                   "tp2dp2_mlp on 256 tokens: twice the sequence"),
        Experiment("tp2dp2_mlp_b512", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_allreduce_b512,
                   "tp2dp2_mlp on 512 tokens: TP and DP AllReduce both 1 MiB"),
        Experiment("tp4_mlp_b256", "tp=4", ("TP", "DP"), tp_mlp.build_allreduce_b256,
                   "tp2dp2_mlp_b256's MLP on TP4: the 256 tokens a step that tp2dp2_mlp's two replicas take"),
        Experiment("tp2dp2_mlp_sp", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_sequence_parallel,
                   "the same MLP, sequence parallel: ReduceScatter + AllGather"),
        Experiment("pp2_mb1", PP_LAYOUT, ("PP", "DP"), pipeline.build_mb1,
                   "2-stage GPipe pipeline, 1 micro-batch of 64"),
        Experiment("pp2_mb4", PP_LAYOUT, ("PP", "DP"), pipeline.build_mb4,
                   "2-stage GPipe pipeline, 4 micro-batches of 16"),
        Experiment("pp2_mb8", PP_LAYOUT, ("PP", "DP"), pipeline.build_mb8,
                   "2-stage GPipe pipeline, 8 micro-batches of 8"),
        Experiment("moe_balanced", "ep=2,dp=4", ("EP", "DP-EP"), moe.build_balanced,
                   "top-1 MoE over EP2, balanced splits [32, 32]"),
        Experiment("moe_skewed", "ep=2,dp=4", ("EP", "DP-EP"), moe.build_skewed,
                   "top-1 MoE over EP2, 7:1 skewed splits [56, 8]"),
        Experiment("toy8_tp2pp2dp2_1f1b", "tp=2,pp=2,dp=2,order=tp-cp-ep-dp-pp", ("TP", "DP", "PP"),
                   toy_transformer.build, "8-rank TP2 PP2 DP2 toy GPT, 1F1B, 4 micro-batches", profile_memory=True),
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(EXPERIMENTS), help="experiments to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "traces")
    args = parser.parse_args()
    for name in args.only or EXPERIMENTS:
        exp = EXPERIMENTS[name]
        load, started = os.getloadavg()[0], time.perf_counter()
        folder = launch(exp, args.out)
        size = sum(f.stat().st_size for f in folder.glob("*.json.gz"))
        print(f"{name}: {exp.summary}; {time.perf_counter() - started:.1f} s, {size / 1e3:.0f} kB -> {folder} "
              f"(1-min load average before: {load:.1f})")
        print(f"  traceana ingest {folder} --layout {exp.layout}")


if __name__ == "__main__":
    main()
