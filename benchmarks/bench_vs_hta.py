"""traceana against Holistic Trace Analysis (HTA) on identical files, in one run, with the JSON parse floor.

The files: 16 copies of ../shared/traces/kineto/hta_rank0of16_a2a_rs_ag.json.gz, decompressed, each with its
distributedInfo rank set (0..15) through a JSON load and dump, written to a temporary folder. Rows:
  traceana ingest   `traceana ingest DIR` (CLI defaults: every core once the files hold 64 MiB to parse)
  HTA load          `TraceAnalysis(trace_dir=DIR)`, which parses every rank's trace into DataFrames
  orjson, 1 / 2      read + orjson.loads of every file, in one process and in a 2-process pool: parsing alone
Each row is best of --repeats, run as its own process, timed wall-clock with its imports (as a user meets them),
CPU seconds (workers included) and peak RSS from os.wait4. HTA and orjson are optional (`pip install -e .[bench]`):
a row whose library is not importable is skipped with the reason. Run:
    .venv/bin/python benchmarks/bench_vs_hta.py [--repeats 1] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path

from bench_scale import measure, run

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "kineto" / "hta_rank0of16_a2a_rs_ag.json.gz"
RANKS = 16
HTA_LOAD = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"


def write_ranks(folder: Path) -> int:
    """Write the RANKS copies, each with its own distributedInfo rank; returns the trace events per file."""
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    for rank in range(RANKS):
        trace["distributedInfo"]["rank"] = rank
        (folder / f"rank{rank}.json").write_text(json.dumps(trace))
    return len(trace["traceEvents"])


def parse(path: Path) -> int:
    import orjson  # optional: imported only where used

    return len(orjson.loads(path.read_bytes())["traceEvents"])


def parse_all(folder: Path, processes: int) -> None:
    """The parse floor: read and orjson.loads every file of the folder, in one process or a pool."""
    files = sorted(folder.iterdir())
    if processes == 1:
        list(map(parse, files))
    else:
        with Pool(processes) as pool:
            pool.map(parse, files, chunksize=1)


def best(repeats: int, timed: Callable[[], tuple[float, float, float]]) -> tuple[float, float, float]:
    """The (wall, CPU, RSS) of the repeat with the least wall time."""
    return min((timed() for _ in range(repeats)), key=lambda t: t[0])


def missing(module: str) -> str | None:
    return None if importlib.util.find_spec(module) else f"{module} is not importable (pip install -e .[bench])"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="where the copies and the store go (default: a temporary one)")
    parser.add_argument("--parse-floor", nargs=2, metavar=("PROCESSES", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse_floor:
        return parse_all(Path(args.parse_floor[1]), int(args.parse_floor[0]))
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f} at start")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)  # the temporary folder goes inside it
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        folder, db = Path(tmp) / "traces", Path(tmp) / "bench.duckdb"
        folder.mkdir()
        events = RANKS * write_ranks(folder)
        size = sum(path.stat().st_size for path in folder.iterdir())
        print(f"input: {RANKS} x {SOURCE.name}, rank rewritten: {size / 1e6:.0f} MB JSON, {events:,} trace events")

        def ingest() -> tuple[float, float, float]:
            db.unlink(missing_ok=True)
            return run("ingest", folder, "--db", db)

        rows = [("traceana ingest", None, ingest),
                ("HTA load", missing("hta"), lambda: measure([sys.executable, "-c", HTA_LOAD, str(folder)])),
                *((f"orjson, {n} process{'es' * (n > 1)}", missing("orjson"),
                   lambda n=n: measure([sys.executable, __file__, "--parse-floor", str(n), str(folder)]))
                  for n in (1, 2))]
        print(f"\n{'':<22}{'wall s':>8}{'MB/s':>8}{'events/s':>12}{'CPU s':>8}{'peak RSS MiB':>14}")
        walls = {}
        for label, skip, timed in rows:
            if skip:
                print(f"{label:<22}skipped: {skip}")
                continue
            wall, cpu, rss = walls[label] = best(args.repeats, timed)
            print(f"{label:<22}{wall:>8.1f}{size / 1e6 / wall:>8.1f}{events / wall:>12,.0f}{cpu:>8.1f}{rss:>14,.0f}",
                  flush=True)
    if "HTA load" in walls:
        print(f"\ntraceana ingest is {walls['HTA load'][0] / walls['traceana ingest'][0]:.1f}x faster than HTA's load")


if __name__ == "__main__":
    main()
