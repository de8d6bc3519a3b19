"""nsys ingest throughput: the largest shared SQLite export (read + finish, then the store write), and a synthetic
run of N ranks (`traceana synth --format nsys`) read in 1 and in 2 worker processes.

Prints seconds, MB/s of export file and kernels/s (and all device events + NVTX ranges per second); for the
synthetic run, the reading of the files (the per-report work that --jobs spreads) apart from the whole read_run
(which adds ranks, clocks, step windows and collectives across reports, in the main process).
Run: .venv/bin/python benchmarks/bench_nsys.py [--ranks 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path

from ingest_timing import load, print_phases, sqlite_reader, synthesize, time_ingest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nsys"


def kernel_count(exports: list[Path]) -> int:
    total = 0
    for export in exports:
        with sqlite3.connect(f"file:{export}?mode=ro&immutable=1", uri=True) as con:
            total += con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    return total


def shared_export(repeats: int) -> None:
    export = max(SHARED.glob("*.sqlite"), key=lambda p: p.stat().st_size)
    kernels = kernel_count([export])
    best_read, best_total, data = time_ingest([export], "nsys", repeats)
    mb = export.stat().st_size / 1e6
    rows = data.table("device_events").height + data.table("annotations").height
    print(f"export: {export.name}  ({mb:.2f} MB, {kernels:,} kernels, {data.table('device_events').height:,} device "
          f"events, {data.table('annotations').height:,} NVTX ranges; best of {repeats})")
    print(f"{'stage':<22}{'seconds':>9}{'MB/s':>9}{'kernels/s':>12}{'rows/s':>12}")
    for label, seconds in (("read+finish", best_read), ("ingest incl. store", best_total)):
        print(f"{label:<22}{seconds:>9.3f}{mb / seconds:>9.1f}{kernels / seconds:>12,.0f}{rows / seconds:>12,.0f}")


def synthetic(ranks: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = synthesize("nsys", ranks, Path(tmp) / "run")
        exports = sorted(folder.glob("*.sqlite"))
        mb, kernels = sum(p.stat().st_size for p in exports) / 1e6, kernel_count(exports)
        print(f"\nsynthetic: {ranks} reports, {mb:.1f} MB, {kernels:,} kernels (best of {repeats})")
        print_phases(folder, "nsys", repeats, mb, kernels, "kernels")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"SQLite reader: {sqlite_reader()}; {load()}")
    shared_export(args.repeats)
    synthetic(args.ranks, args.repeats)
    print(load())


if __name__ == "__main__":
    main()
