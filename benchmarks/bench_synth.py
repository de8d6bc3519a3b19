"""Why the Kineto writer builds its lines with Polars: one rank (~110k trace events) written by synth.kineto, against
the same kernels and launches written as Python dicts through json.dumps (the stdlib route, 2 of the 6 event kinds
only, so the stdlib's figure flatters it). Also times the simulation of the whole world (every stage).

Run: .venv/bin/python benchmarks/bench_synth.py [--ranks 64]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from traceana.synth import kineto, schedule

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "synth_gpt_tp2pp2.yaml"


def stdlib_kernels(trace: schedule.RankTrace, names: list[str], path: Path) -> None:
    """Kernels and runtime launches only, as dicts through json.dumps."""
    launch = schedule.launch_times(trace).to_list()
    with path.open("w") as handle:
        handle.write('{"traceEvents":[\n')
        for i, (start, end, name) in enumerate(trace.ops.select("start_ns", "end_ns", "name").iter_rows()):
            handle.write(json.dumps({"ph": "X", "cat": "kernel", "name": names[name], "pid": 0, "tid": 7,
                                     "ts": start / 1e3, "dur": (end - start) / 1e3,
                                     "args": {"External id": i + 1, "correlation": i + 1, "stream": 7}}) + ",\n")
            handle.write(json.dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                                     "tid": 1, "ts": launch[i] / 1e3, "dur": 2.0,
                                     "args": {"External id": i + 1, "correlation": i + 1}}) + ",\n")
        handle.write("{}]}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    args = parser.parse_args()
    options = schedule.Options(ranks=args.ranks, steps=8, kernel_us=3)
    began = time.perf_counter()
    plan = schedule.load(str(CONFIG), options)
    traces = plan.stage_traces()
    first = next(traces)
    count = 1 + sum(1 for _ in traces)
    simulate = time.perf_counter() - began
    print(f"plan + simulate {count} ranks x {options.steps} steps: {simulate:.1f} s "
          f"({first.ops.height:,} device ops per rank)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        began = time.perf_counter()
        path = kineto.write_rank(plan, first, out)
        polars_s = time.perf_counter() - began
        size = path.stat().st_size
        events = path.read_bytes().count(b"\n") - 2
        began = time.perf_counter()
        stdlib_kernels(first, plan.names, out / "stdlib.json")
        stdlib_s = time.perf_counter() - began
        stdlib_events = 2 * first.ops.height
    print(f"{'writer':<34}{'s':>7}{'events':>10}{'events/s':>12}{'MB/s':>8}")
    print(f"{'synth.kineto (Polars lines)':<34}{polars_s:>7.2f}{events:>10,}{events / polars_s:>12,.0f}"
          f"{size / 1e6 / polars_s:>8.1f}")
    print(f"{'json.dumps per event (2 kinds)':<34}{stdlib_s:>7.2f}{stdlib_events:>10,}"
          f"{stdlib_events / stdlib_s:>12,.0f}{'':>8}")


if __name__ == "__main__":
    main()
