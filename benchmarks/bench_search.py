"""Strategy-search throughput: candidates validated and estimated per minute on this machine.

Runs `search` over two example jobs: DESIGN §5's DeepSeek-V3 on 2048 H800 (tens of thousands of layouts, most of
which do not fit or are provably slower than the top list) and vTrain's 1.3B GPT on one 8-GPU node (every layout
fits). Prints candidates, fitting, simulated, seconds and candidates/minute, plus full estimates (a pipeline
simulation each, nothing skipped) per minute over an even sample of the candidates.
Run: .venv/bin/python benchmarks/bench_search.py
"""

from __future__ import annotations

import time
from pathlib import Path

from traceana.estimator.config import load
from traceana.estimator.estimate import estimate
from traceana.estimator.search import candidates, search

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> None:
    for name in ("deepseek_v3.yaml", "vtrain_calibrated.yaml"):
        cfg = load(EXAMPLES / name)
        result = search(cfg, top=10)
        best = result.best[0]
        print(f"{name}: {result.candidates:,} candidates, {result.fitting:,} fit, {result.simulated:,} simulated in "
              f"{result.seconds:.1f} s = {result.candidates / result.seconds * 60:,.0f} candidates/min; best "
              f"{best.step_s * 1e3:,.1f} ms ({best.config.parallel.layout.spec}, {best.config.schedule.kind})")
        every = list(candidates(cfg))
        sample = every[:: max(1, len(every) // 1000)]
        started = time.perf_counter()
        for candidate in sample:
            estimate(candidate)
        seconds = time.perf_counter() - started
        print(f"  full estimate (memory + simulated pipeline, no pruning) of {len(sample):,} evenly spaced "
              f"candidates: {len(sample) / seconds * 60:,.0f} per minute")


if __name__ == "__main__":
    main()
