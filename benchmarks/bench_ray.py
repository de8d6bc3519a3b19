"""`traceana ingest --executor ray` against local worker processes, and the analyses over a Parquet dataset against
a .duckdb store, on the 16-rank set of bench_vs_hta.py (16 x hta_rank0of16_a2a_rs_ag, rank rewritten), in one run.

Ingest rows: `--jobs 2` into a .duckdb store and into a dataset; `--executor ray` starting its own local Ray (what a
one-off command pays), and on a standing Ray (started here by ray.init(num_cpus=--cpus), passed by --ray-address:
what each ingest pays on a running cluster). Analysis rows: breakdown and stragglers over each store. Wall seconds
with imports, best of --repeats; CPU seconds are the command's and the children it waited for (Ray's own daemons
and workers are not among them, so the Ray rows' CPU is the driver's only). Needs Ray (pip install -e .[ray]). Run:
    .venv/bin/python benchmarks/bench_ray.py [--repeats 1] [--cpus 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_scale import run
from bench_vs_hta import RANKS, SOURCE, best, write_ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the standing Ray")
    parser.add_argument("--workdir", type=Path, help="where the copies and the stores go (default: a temporary one)")
    args = parser.parse_args()
    import ray

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, Ray {ray.__version__}; load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        folder, db, dataset = Path(tmp) / "traces", Path(tmp) / "bench.duckdb", Path(tmp) / "bench.parquet"
        folder.mkdir()
        events = RANKS * write_ranks(folder)
        size = sum(path.stat().st_size for path in folder.iterdir())
        print(f"input: {RANKS} x {SOURCE.name}, rank rewritten: {size / 1e6:.0f} MB JSON, {events:,} trace events")

        def ingest(target: Path, *options: object) -> Callable[[], tuple[float, float, float]]:
            def timed() -> tuple[float, float, float]:
                shutil.rmtree(target, ignore_errors=True)
                target.unlink(missing_ok=True)
                return run("ingest", folder, "--db", target, *options)
            return timed

        rows: list[tuple[str, Callable[[], tuple[float, float, float]]]] = [
            ("ingest --jobs 2 -> .duckdb", ingest(db, "--jobs", 2)),
            ("ingest --jobs 2 -> dataset", ingest(dataset, "--jobs", 2)),
            ("ingest ray, Ray started by it", ingest(dataset, "--executor", "ray")),
        ]
        print(f"\n{'':<34}{'wall s':>8}{'MB/s':>8}{'CPU s':>8}{'peak RSS MiB':>14}")
        for label, timed in rows:
            wall, cpu, rss = best(args.repeats, timed)
            print(f"{label:<34}{wall:>8.1f}{size / 1e6 / wall:>8.1f}{cpu:>8.1f}{rss:>14,.0f}", flush=True)
        context = ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level=logging.ERROR)
        try:
            label = f"ingest ray, standing Ray ({args.cpus} CPUs)"
            wall, cpu, rss = best(args.repeats, ingest(dataset, "--executor", "ray",
                                                       "--ray-address", context.address_info["address"]))
            print(f"{label:<34}{wall:>8.1f}{size / 1e6 / wall:>8.1f}{cpu:>8.1f}{rss:>14,.0f}", flush=True)
        finally:
            ray.shutdown()
        print(f"\n{'':<34}{'wall s':>8}{'CPU s':>8}{'peak RSS MiB':>14}")
        for command in ("breakdown", "stragglers"):
            for kind, store in ((".duckdb", db), ("dataset", dataset)):
                wall, cpu, rss = best(args.repeats, lambda command=command, store=store: run(command, "--db", store))
                print(f"{f'{command} over {kind}':<34}{wall:>8.1f}{cpu:>8.1f}{rss:>14,.0f}", flush=True)


if __name__ == "__main__":
    main()
