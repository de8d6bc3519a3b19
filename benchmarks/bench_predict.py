"""`traceana predict` on real pairs: the step of run B predicted from run A, against B's measured step and against
`estimate` of B from scratch. Pairs: the sample traces' (sample_traces/traces, both directions), the three recorded
for predict (pp2_mb4, tp2dp2_mlp_b256, tp4_mlp_b256: micro-batches, sequence, layout), and the shared H200 traces
(another model; other batch sizes, which have no measured truth). Each `predict` is its own process, timed. Measured
B is compare's mean over ranks of the typical step (the same number as `traceana breakdown --json`), the estimate
compare's. "misplaced": time put in the wrong dim, the sum over dims of |predicted - measured| as % of B's step, for
predict and for the estimate (a step that lands near by cancelling errors shows them here). Nothing here is fitted:
the prediction's error bar is measured on A alone.

Then the recording noise: each run of the pairs recorded again, in rounds of one run after another
(sample_traces/repeats/r1..r3: the three sample pairs' six; r4..r6: the recorded pairs' six runs; `generate.py
--out`): per pair over the rounds that hold both its runs, B's steps, their median and spread ((max - min) /
median), and the prediction from each recording of A against B's median, so that a miss the noise explains shows
apart from one the method makes every time. Run:
    .venv/bin/python benchmarks/bench_predict.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.test_sample_traces import RECORDED  # noqa: E402  the layouts the samples are ingested with

TRACEANA = [sys.executable, "-m", "traceana"]
CONFIGS = ROOT / "sample_traces" / "configs"
KINETO = ROOT.parent / "shared" / "traces" / "kineto"
REPEATS = sorted((ROOT / "sample_traces" / "repeats").glob("r*"))
H200 = "h200_hostbound_h512_L12_s256_gb8"
H200_CFG = ROOT / "examples" / "h200_hostbound_h512_L12.yaml"
SAMPLE_PAIRS = [("pp2_mb1", "pp2_mb8"), ("tp2dp2_mlp", "tp2dp2_mlp_sp"), ("moe_balanced", "moe_skewed")]
RECORDED_PAIRS = [("pp2_mb1", "pp2_mb4"), ("pp2_mb4", "pp2_mb8"), ("tp2dp2_mlp", "tp2dp2_mlp_b256"),
                  ("tp2dp2_mlp", "tp4_mlp_b256")]  # micro-batches, sequence, layout


def cli(*args: object) -> dict:
    out = subprocess.run([*TRACEANA, *map(str, args)], capture_output=True, text=True, check=True).stdout
    return json.loads(out) if out.lstrip().startswith(("{", "[")) else {}


def total_of(rows: list[dict], key: str) -> float:
    return next(r[key] for r in rows if r["dim"] == "TOTAL")


def row(label: str, db: Path, run: str, cfg: Path, target: Path, truth: str | None) -> None:
    started = time.perf_counter()
    pred = cli("predict", run, "--config", cfg, "--to", target, "--json", "--db", db)
    seconds = time.perf_counter() - started
    predicted, bar = total_of(pred["step"], "predicted_B_ms"), total_of(pred["step"], "error_bar_ms")
    estimated = total_of(pred["step"], "estimated_B_ms")
    if truth is None:
        print(f"{label:<46}{'(no run)':>11}{predicted:>10.1f}{bar:>8.1f}{'':>9}{estimated:>10.1f}{'':>9}{'':>8}"
              f"{'':>27}{seconds:>7.1f}")
        return
    by_dim = cli("compare", "--estimate", target, truth, "--json", "--db", db)["by_dimension"]
    measured = total_of(by_dim, "measured_ms")
    miss = predicted - measured
    print(f"{label:<46}{measured:>11.1f}{predicted:>10.1f}{bar:>8.1f}{100 * miss / measured:>+9.1f}"
          f"{estimated:>10.1f}{100 * (estimated - measured) / measured:>+9.1f}{'yes' if abs(miss) <= bar else 'no':>8}"
          f"{misplaced(by_dim, pred['step'], 'predicted_B_ms'):>17.0f}%"
          f"{misplaced(by_dim, pred['step'], 'estimated_B_ms'):>8.0f}%{seconds:>7.1f}", flush=True)


def misplaced(by_dim: list[dict], step: list[dict], key: str) -> float:
    """Time put in the wrong dim, % of B's measured step: the sum over dims (TOTAL aside) of |predicted - measured|,
    so a step that lands near by cancelling errors per dim still shows them."""
    measured = {r["dim"]: r["measured_ms"] for r in by_dim}
    got = {r["dim"]: r[key] or 0.0 for r in step}
    dims = (set(measured) | {d for d, v in got.items() if v}) - {"TOTAL"}
    return 100 * sum(abs(got.get(d, 0.0) - measured.get(d, 0.0)) for d in dims) / measured["TOTAL"]


def h200(db: Path, work: Path) -> None:
    """The host-bound H200 trace: another model with a measured truth, and other batch sizes without one."""
    cli("ingest", KINETO / f"{H200}.json.gz", "--db", db)
    cli("ingest", KINETO / "h200_gpt_h2048_L8_s1024_gb4.json.gz", "--db", db)
    row(f"{H200[:14]} -> h2048_L8 (another model)", db, H200, H200_CFG, ROOT / "examples" / "h200_gpt_h2048_L8.yaml",
        "h200_gpt_h2048_L8_s1024_gb4")
    base = yaml.safe_load(H200_CFG.read_text())
    for batch in (4, 16, 32):
        target = work / f"h200_gb{batch}.yaml"
        target.write_text(yaml.safe_dump({**base, "parallel": {**base["parallel"], "global_batch": batch}}))
        row(f"{H200[:14]} gb8 -> gb{batch}", db, H200, H200_CFG, target, None)


def measured_step(db: Path, run: str) -> float:
    rows = cli("breakdown", run, "--by", "rank", "--json", "--db", db)
    return sum(r["TOTAL_ms"] for r in rows) / len(rows)


def repeats(db: Path) -> None:
    """Each pair over every repeat folder that holds both of its runs: B's spread, and predict from each A against
    B's median."""
    for folder in REPEATS:
        for run in sorted(p for p in folder.iterdir() if p.is_dir()):
            cli("ingest", run, "--layout", RECORDED[run.name][0], "--db", db, "--run-id", f"{run.name}_{folder.name}")
    print(f"\n{'A -> B, recorded again':<32}{'B per recording ms':>32}{'median':>8}{'spread':>8}"
          f"{'predict from each A':>30}{'err % vs median':>36}")
    for a, b in [*SAMPLE_PAIRS, *RECORDED_PAIRS]:
        folders = [f for f in REPEATS if (f / a).is_dir() and (f / b).is_dir()]
        steps = [measured_step(db, f"{b}_{f.name}") for f in folders]
        median = sorted(steps)[len(steps) // 2]
        predicted = [total_of(cli("predict", f"{a}_{f.name}", "--config", CONFIGS / f"{a}.yaml", "--to",
                                  CONFIGS / f"{b}.yaml", "--json", "--db", db)["step"], "predicted_B_ms")
                     for f in folders]
        print(f"{f'{a} -> {b}':<32}{' / '.join(f'{t:.0f}' for t in steps):>32}{median:>8.1f}"
              f"{100 * (max(steps) - min(steps)) / median:>7.0f}%{' / '.join(f'{p:.0f}' for p in predicted):>30}"
              f"{' / '.join(f'{100 * (p - median) / median:+.0f}' for p in predicted):>36}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traceana-predict-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "pairs.duckdb"
    db.unlink(missing_ok=True)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    try:
        for name, (layout, _) in RECORDED.items():
            cli("ingest", ROOT / "sample_traces" / "traces" / name, "--layout", layout, "--db", db)
        print(f"{'A -> B (step ms)':<46}{'measured B':>11}{'predict':>10}{'± bar':>8}{'err %':>9}{'estimate':>10}"
              f"{'err %':>9}{'covers':>8}{'misplaced predict':>18}{'estimate':>9}{'s':>7}")
        pairs = [*SAMPLE_PAIRS, *[(b, a) for a, b in SAMPLE_PAIRS], *RECORDED_PAIRS]
        for a, b in pairs:
            row(f"{a} -> {b}", db, a, CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml", b)
        if (KINETO / f"{H200}.json.gz").exists():
            h200(db, work)
        else:
            print(f"(skipped the H200 rows: {KINETO} is not there)")
        repeats(db)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
