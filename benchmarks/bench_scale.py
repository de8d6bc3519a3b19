"""The scale curve: synthetic Kineto runs of N ranks (same trace per rank, ~110k JSON events as in
hta_rank3of8_6steps), written by `traceana synth` or copied from one real rank (`--replicate`), ingested by
`traceana ingest`, then the breakdown, stragglers and critical-path commands; and a command's fixed cost (`--help`,
`runs`).

Each step runs as its own process, timed wall-clock, with its peak RSS from os.wait4 (the largest single process);
for the ingest also the main process's own peak and the largest worker's (VmHWM, polled from /proc). Prints one
table. Run:
    .venv/bin/python benchmarks/bench_scale.py --ranks 16,64,256 [--steps 8 --kernel-us 3] [--workdir DIR]
    .venv/bin/python benchmarks/bench_scale.py --traces DIR [--workdir DIR]   (an existing synth folder's traces/)
    .venv/bin/python benchmarks/bench_scale.py --ranks 4096 --parquet --jobs 2   (out of core: a Parquet dataset)
    .venv/bin/python benchmarks/bench_scale.py --ranks 1024 \
        --replicate ../shared/traces/kineto/hta_rank3of8_6steps.json.gz   (a real trace's size: N copies of one
        rank, each its own distributedInfo rank, as bench_vs_hta.py does; the "synth" columns time the copying)
The work folder (default: a temporary one) holds the traces and stores; it is removed unless --keep is given.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
TRACEANA = [sys.executable, "-m", "traceana"]


def measure(command: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS MiB) of one command: the CPU time counts the worker processes it waited
    for; the RSS is its largest single process."""
    return measure_tree(command)[:3]


def _peaks(pid: int, found: dict[int, int]) -> None:
    """Record the peak RSS (VmHWM, KiB) of ``pid`` and its descendants into ``found``."""
    try:
        found[pid] = max(found.get(pid, 0), int(next(
            line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmHWM"))))
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except (OSError, StopIteration, ValueError):
        return
    for child in children:
        _peaks(child, found)


def measure_tree(command: list[str]) -> tuple[float, float, float, float, float]:
    """measure(), plus the peak RSS MiB of the command's own process and of its largest descendant (a worker),
    polled every 0.2 s (0 where it has none)."""
    began = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found: dict[int, int] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.2):
            _peaks(child.pid, found)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _, status, usage = os.wait4(child.pid, 0)
    done.set()
    poller.join()
    wall = time.perf_counter() - began
    if status:
        raise SystemExit(f"{' '.join(command)} failed:\n{child.stderr.read().decode()}")
    workers = [kib for pid, kib in found.items() if pid != child.pid]
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, found.get(child.pid, 0) / 1024,
            max(workers, default=0) / 1024)


def run(*args: object) -> tuple[float, float, float]:
    """measure() of one traceana command."""
    return measure([*TRACEANA, *map(str, args)])


def replicate(source: Path, folder: Path, ranks: int) -> tuple[float, float, float]:
    """Write ``ranks`` copies of the Kineto trace ``source`` (JSON or .json.gz) into ``folder``, each with its own
    distributedInfo rank and world size, one event a line as `traceana synth` writes them; measure()'s figures of
    the writing (this process's)."""
    began, cpu = time.perf_counter(), time.process_time()
    trace = json.loads(gzip.decompress(data) if (data := source.read_bytes())[:2] == b"\x1f\x8b" else data)
    events = b",\n".join(json.dumps(e, separators=(",", ":")).encode() for e in trace.pop("traceEvents"))
    folder.mkdir(parents=True)
    for rank in range(ranks):
        trace["distributedInfo"] = {**trace.get("distributedInfo", {}), "rank": rank, "world_size": ranks}
        head = json.dumps(trace, separators=(",", ":"))[:-1].encode() + b',"traceEvents":[\n'
        (folder / f"rank{rank}.json").write_bytes(head + events + b"\n]}\n")
    return time.perf_counter() - began, time.process_time() - cpu, float("nan")


def lines(folder: Path) -> tuple[int, int]:
    """(bytes, trace events) of the Kineto files: the writer puts one event per line, after a 1-line header."""
    size = events = 0
    for path in folder.iterdir():
        size += path.stat().st_size
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                events += chunk.count(b"\n")
            events -= 2
    return size, events


def disk(store: Path) -> int:
    """Bytes a store takes on disk: its file, or every file of a Parquet dataset."""
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) if store.is_dir() else store.stat().st_size


def fixed_cost(db: Path, repeats: int = 5) -> list[tuple[str, float, float]]:
    out = []
    for label, args in (("traceana --help", ["--help"]), ("traceana runs", ["runs", "--db", db])):
        times = [run(*args) for _ in range(repeats)]
        out.append((label, min(t[0] for t in times), min(t[1] for t in times)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,64,256")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kernel-us", type=float, default=3.0)
    parser.add_argument("--traces", type=Path, help="ingest this folder of Kineto traces instead of synthesizing")
    parser.add_argument("--replicate", type=Path, help="copy this one-rank Kineto trace to every rank instead of "
                        "synthesizing")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--parquet", action="store_true", help="ingest into a Parquet dataset, not a DuckDB file")
    parser.add_argument("--jobs", type=int, help="ingest's --jobs (default: its own choice)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="traceana-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f} at start")
    header = (f"{'ranks':>6}{'GB':>7}{'events':>13}{'synth s':>9}{'synth MB/s':>11}{'ingest s':>10}"
              f"{'MB/s':>7}{'events/s':>11}{'peak RSS MiB':>13}{'main MiB':>9}{'worker MiB':>11}{'store GB':>9}"
              f"{'breakdown s':>12}{'MiB':>6}{'stragglers s':>13}{'MiB':>6}{'crit-path s':>12}{'MiB':>6}")
    rows = []
    try:
        for ranks in [len(list(args.traces.iterdir()))] if args.traces else map(int, args.ranks.split(",")):
            out, db = work / f"r{ranks}", work / f"r{ranks}.{'parquet' if args.parquet else 'duckdb'}"
            shutil.rmtree(db, ignore_errors=True) if db.is_dir() else db.unlink(missing_ok=True)
            if args.traces:
                traces, synth = args.traces, (float("nan"),) * 3
            elif args.replicate:
                shutil.rmtree(out, ignore_errors=True)
                traces = out / "traces"
                synth = replicate(args.replicate, traces, ranks)
            else:
                shutil.rmtree(out, ignore_errors=True)
                synth = run("synth", CONFIG, out, "--ranks", ranks, "--steps", args.steps, "--kernel-us",
                            args.kernel_us)
                traces = out / "traces"
            size, events = lines(traces)
            jobs = ["--jobs", str(args.jobs)] if args.jobs else []
            ingest = measure_tree([*TRACEANA, "ingest", str(traces), "--db", str(db), "--layout",
                                   f"tp=2,dp={ranks // 4},pp=2", *jobs])
            breakdown = run("breakdown", "--db", db, "--json")
            stragglers = run("stragglers", "--db", db, "--json")
            critical = run("critical-path", "--db", db, "--json")
            rows.append(f"{ranks:>6}{size / 1e9:>7.2f}{events:>13,}{synth[0]:>9.1f}{size / 1e6 / synth[0]:>11.0f}"
                        f"{ingest[0]:>10.1f}{size / 1e6 / ingest[0]:>7.1f}{events / ingest[0]:>11,.0f}"
                        f"{ingest[2]:>13,.0f}{ingest[3]:>9,.0f}{ingest[4]:>11,.0f}{disk(db) / 1e9:>9.2f}"
                        f"{breakdown[0]:>12.1f}{breakdown[2]:>6,.0f}{stragglers[0]:>13.1f}{stragglers[2]:>6,.0f}"
                        f"{critical[0]:>12.1f}{critical[2]:>6,.0f}")
            print(header if len(rows) == 1 else "", rows[-1], sep="\n" if len(rows) == 1 else "", flush=True)
            if not args.traces:
                shutil.rmtree(out)
        print(f"\n{'command fixed cost':<20}{'wall s':>8}{'CPU s':>8}   (best of 5)")
        for label, wall, cpu in fixed_cost(db):
            print(f"{label:<20}{wall:>8.2f}{cpu:>8.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
