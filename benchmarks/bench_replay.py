"""Replay and what-if of one step against ranks: synthetic Kineto runs of N ranks (`traceana synth`, GPT on tp2 pp2,
dp scaled), ingested with their layout, then `traceana replay --step S` and `traceana whatif --step S --change
dim=TP:0.5`, each its own process: wall seconds and peak RSS (os.wait4). Prints one table. With --store, the
whole-run commands over a store already there instead (a Parquet dataset from `bench_scale.py --parquet --keep`):
`replay`, `whatif --change dim=TP:0.5` and `advise`, each --json, each its own process. Run:
    .venv/bin/python benchmarks/bench_replay.py [--ranks 16,64,256,1024] [--kernel-us 200] [--workdir DIR]
    .venv/bin/python benchmarks/bench_replay.py --store DIR/r1024.parquet [--change dim=DP:0.5]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import CONFIG, TRACEANA, measure, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,64,256,1024")
    parser.add_argument("--kernel-us", type=float, default=200.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--store", type=Path, help="time the whole-run commands over this store instead")
    parser.add_argument("--change", default="dim=TP:0.5", help="the what-if's change with --store (the copies of "
                        "hta_rank3of8_6steps have DP only: dim=DP:0.5)")
    args = parser.parse_args()
    if args.store:
        return whole_run(args.store, args.change)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traceana-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'ranks':>6}{'events/step':>13}{'ingest s':>10}{'replay s':>10}{'replay MiB':>12}{'whatif s':>10}"
          f"{'whatif MiB':>12}{'replay error median %':>23}{'worst %':>9}", flush=True)
    try:
        for ranks in map(int, args.ranks.split(",")):
            out, db = work / f"r{ranks}", work / f"r{ranks}.duckdb"
            shutil.rmtree(out, ignore_errors=True)
            db.unlink(missing_ok=True)
            run("synth", CONFIG, out, "--ranks", ranks, "--steps", 2, "--kernel-us", args.kernel_us)
            ingest = run("ingest", out / "traces", "--db", db, "--layout", f"tp=2,dp={ranks // 4},pp=2")
            events = subprocess.run([*TRACEANA, "sql", "--db", str(db), "--format", "json",
                                     "SELECT count(*) AS n FROM device_events e JOIN step_windows w USING (run_id, "
                                     "rank) WHERE w.step = 1 AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns"],
                                    capture_output=True, text=True, check=True).stdout
            replay = measure([*TRACEANA, "replay", "--db", str(db), "--step", "1", "--json"])
            whatif = measure([*TRACEANA, "whatif", "--db", str(db), "--step", "1", "--change", "dim=TP:0.5",
                              "--json"])
            summary = json.loads(subprocess.run([*TRACEANA, "replay", "--db", str(db), "--step", "1", "--json"],
                                                capture_output=True, text=True, check=True).stdout)
            print(f"{ranks:>6}{json.loads(events)[0]['n']:>13,}{ingest[0]:>10.1f}{replay[0]:>10.1f}"
                  f"{replay[2]:>12,.0f}{whatif[0]:>10.1f}{whatif[2]:>12,.0f}"
                  f"{summary['median_abs_error_pct']:>23.2f}{summary['worst_abs_error_pct']:>9.2f}", flush=True)
            shutil.rmtree(out)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def whole_run(store: Path, change: str) -> None:
    """replay, whatif and advise of the store's latest run, each --json in its own process: wall s, peak RSS."""
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.1f} at start; store {store}")
    print(f"{'command':<34}{'wall s':>8}{'peak RSS MiB':>14}", flush=True)
    for command in (["replay"], ["whatif", "--change", change], ["advise"]):
        wall, _, rss = measure([*TRACEANA, *command, "--db", str(store), "--json"])
        print(f"{' '.join(command):<34}{wall:>8.1f}{rss:>14,.0f}", flush=True)


if __name__ == "__main__":
    main()
