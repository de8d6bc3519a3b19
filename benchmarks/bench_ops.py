"""Time `traceana ops` (view op_time, each event's own share of its rank-step) against the breakdown it adds up to
(view rank_step_breakdown), on every shared run and on a run `traceana synth` writes at many ranks. The issue's
bar: ops within 2x the breakdown on every shared run, and at most 60 s at 1,024 synthesized ranks.

    .venv/bin/python benchmarks/bench_ops.py [--ranks 1024] [--steps 2] [--skip-synth]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traceana import store
from traceana.analyses.ops import attribute, levels

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
KINETO = ("h200_gpt_h2048_L8_s1024_gb4", "h200_hostbound_h512_L12_s256_gb8", "hta_rank3of8_6steps",
          "hta_rank0of16_a2a_rs_ag", "tracelens_b200_rank0of8_vllm", "tracelens_mi300_rank0of8_rccl")
SHARED = [TRACES / "kineto" / f"{name}.json.gz" for name in KINETO]
SHARED += [TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite", TRACES / "ascend" / "torch_npu_2rank_level1"]
CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"


def traceana(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "traceana", *map(str, args)], check=True, capture_output=True)


def timed(db: Path, run: str) -> tuple[float, float, int]:
    """Seconds for every row of rank_step_breakdown, for `ops --by <the run's first level>` (every row of op_time
    where it has none), and the events."""
    with store.connect(db, read_only=True) as con:
        level = (levels(con, run) or [None])[0]  # also pays Arrow's and Polars' first-use cost, untimed
        start = time.perf_counter()
        con.execute("SELECT * FROM rank_step_breakdown WHERE run_id = ?", [run]).fetchall()
        breakdown = time.perf_counter() - start
        start = time.perf_counter()
        if level is None:
            con.execute("SELECT * FROM op_time WHERE run_id = ?", [run]).fetchall()
        else:
            attribute(con, run, level)
        ops = time.perf_counter() - start
        events = con.execute("SELECT count(*) FROM device_events WHERE run_id = ?", [run]).fetchall()[0][0]
    return breakdown, ops, events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--skip-synth", action="store_true")
    args = parser.parse_args()
    print(f"{'run':<44}{'events':>10}{'breakdown s':>13}{'ops s':>8}{'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        for path in SHARED:
            run = path.name.split(".")[0]
            traceana("ingest", path, "--db", db, "--run-id", run)
            breakdown, ops, events = timed(db, run)
            print(f"{run:<44}{events:>10,}{breakdown:>13.3f}{ops:>8.3f}{ops / breakdown:>7.2f}")
        if args.skip_synth:
            return
        traces = Path(tmp) / "synth"
        start = time.perf_counter()
        traceana("synth", CONFIG, traces, "--ranks", args.ranks, "--steps", args.steps, "--format", "kineto")
        traceana("ingest", traces / "traces", "--db", db, "--run-id", "synth")
        prepared = time.perf_counter() - start
        breakdown, ops, events = timed(db, "synth")
        print(f"{f'synth {args.ranks} ranks x {args.steps} steps':<44}{events:>10,}{breakdown:>13.3f}{ops:>8.3f}"
              f"{ops / breakdown:>7.2f}   (synth + ingest {prepared:.0f} s)")


if __name__ == "__main__":
    main()
