"""Regenerate the sample traces: seed 002's experiments as real gloo jobs under torch.profiler.

    .venv/bin/python sample_traces/generate.py [--only NAME ...] [--out DIR]

Writes DIR/<experiment>/rank<N>.json.gz (default DIR: sample_traces/traces). Needs torch (`pip install -e .[traces]`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import tp_mlp
from harness import Experiment, launch

EXPERIMENTS = {
    e.name: e
    for e in (
        Experiment("tp2dp2_mlp", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_allreduce,
                   "TP2xDP2 two-layer MLP, row-parallel output AllReduce"),
        Experiment("tp2dp2_mlp_sp", "tp=2,dp=2", ("TP", "DP"), tp_mlp.build_sequence_parallel,
                   "the same MLP, sequence parallel: ReduceScatter + AllGather"),
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(EXPERIMENTS), help="experiments to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "traces")
    args = parser.parse_args()
    for name in args.only or EXPERIMENTS:
        exp = EXPERIMENTS[name]
        started = time.perf_counter()
        folder = launch(exp, args.out)
        size = sum(f.stat().st_size for f in folder.glob("*.json.gz"))
        print(f"{name}: {exp.summary}; {time.perf_counter() - started:.1f} s, {size / 1e3:.0f} kB -> {folder}")
        print(f"  traceana ingest {folder} --layout {exp.layout}")


if __name__ == "__main__":
    main()
