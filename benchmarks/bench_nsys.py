"""nsys ingest throughput: the largest shared SQLite export (read + finish, then the store write), and a synthetic
run of N ranks (`traceana synth --format nsys`) read in 1 and in 2 worker processes; and the whole `traceana ingest`
command beside `nsys stats --report cuda_gpu_kern_sum` (`gpukernsum` before nsys 2023) on the same export, the
largest shared one and one synthetic rank of --steps steps (160: 731,040 kernels), each the best of --repeats runs
taken in turn (the machine is shared: wall and CPU seconds, the CPU of every process the command ran).

Prints seconds, MB/s of export file and kernels/s (and all device events + NVTX ranges per second); for the
synthetic run, the reading of the files (the per-report work that --jobs spreads) apart from the whole read_run
(which adds ranks, clocks, step windows and collectives across reports, in the main process).
With --vs nsys-ai, only the comparison with nsys-ai instead (vs_nsysai.py says how to install it beside traceana):
on the shared 2xH100 export and on synthetic ranks of 328 and 1,313 steps (1.5M and 6M kernels), or on --export.
Run: .venv/bin/python benchmarks/bench_nsys.py [--ranks 16] [--repeats 3] [--steps 160] [--against-nsys-only]
     .venv/bin/python benchmarks/bench_nsys.py --vs nsys-ai [--nsys-ai PATH] [--export FILE ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingest_timing import load, print_phases, sqlite_reader, synthesize, time_ingest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nsys"
H100 = SHARED / "nsysai_h100_2proc_nsys2026.2.sqlite"
VS_STEPS = (328, 1313)  # synthetic ranks of 1,498,632 and 5,999,097 kernels


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


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of ``command``, which must succeed; CPU is user + system of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def kernel_summary(nsys: str, export: Path, cwd: Path) -> list[str]:
    """The `nsys stats` command of the CUDA kernel summary this nsys has (renamed in 2023.1): the one that writes
    its table (nsys exits 0 for an unknown report too)."""
    for report in ("cuda_gpu_kern_sum", "gpukernsum"):
        command = [nsys, "stats", "--report", report, "--format", "csv", "--force-overwrite", "true",
                   "--output", str(cwd / "summary"), str(export)]
        table = cwd / f"summary_{report}.csv"
        table.unlink(missing_ok=True)
        subprocess.run(command, cwd=cwd, capture_output=True, check=False)
        if table.is_file():
            return command
    raise SystemExit(f"nsys stats has no kernel summary report for {export}")


def against_nsys_stats(exports: list[Path], repeats: int) -> None:
    """The whole `traceana ingest` (a new store each time) beside the kernel summary of `nsys stats`, and beside
    the floor of any ingest into DuckDB (FLOOR)."""
    nsys = shutil.which("nsys")
    if nsys is None:
        print("\nnsys not on PATH: no `nsys stats` comparison")
        return
    traceana = str(Path(sys.executable).with_name("traceana"))
    print(f"\nwhole ingest against nsys stats (best of {repeats}; wall / CPU seconds)")
    print(f"{'export':<40}{'kernels':>10}{'nsys stats':>14}{'traceana ingest':>18}{'ratio':>7}{'floor':>16}"
          f"{'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for export in exports:
            summary = kernel_summary(nsys, export, cwd)
            best = {"nsys": (float("inf"), 0.0), "ingest": (float("inf"), 0.0), "floor": (float("inf"), 0.0)}
            for _ in range(repeats):
                for side, command in (("nsys", summary),
                                      ("ingest", [traceana, "ingest", str(export), "--db", str(cwd / "bench.duckdb")]),
                                      ("floor", [sys.executable, "-c", FLOOR, str(export), str(cwd / "floor.duckdb")])):
                    for db in ("bench.duckdb", "floor.duckdb"):
                        (cwd / db).unlink(missing_ok=True)
                    best[side] = min(best[side], timed(command, cwd))
            (nw, nc), (iw, ic), (fw, fc) = best["nsys"], best["ingest"], best["floor"]
            print(f"{export.name[:39]:<40}{kernel_count([export]):>10,}{nw:>7.2f} / {nc:<4.2f}{iw:>10.2f} / {ic:<5.2f}"
                  f"{iw / nw:>7.2f}{fw:>9.2f} / {fc:<5.2f}{fw / nw:>7.2f}")


# The least any ingest into a DuckDB store does, as a command of its own: start Python, import what the ingest
# imports (DuckDB, Polars, PyArrow, the ADBC SQLite driver), read every kernel with its name, write those rows to a
# new DuckDB file as they are (no classifying, no steps, no other table).
FLOOR = """
import sys
import adbc_driver_sqlite.dbapi, duckdb, polars, pyarrow
cur = adbc_driver_sqlite.dbapi.connect(f"file:{sys.argv[1]}?mode=ro&immutable=1").cursor()
cur.execute("SELECT k.start, k.end, k.deviceId, k.streamId, k.correlationId, s.value AS name "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName")
kernels = cur.fetch_arrow_table()
duckdb.connect(sys.argv[2]).execute("CREATE TABLE kernels AS SELECT * FROM kernels")
"""


def synthetic_rank(steps: int, folder: Path) -> Path:
    """Rank 0 of a 4-rank synthetic run of ``steps`` steps, alone (one export of 4,569 kernels per step)."""
    export = synthesize("nsys", 4, folder / "run", steps=steps) / "report_rank0000_node0000.sqlite"
    return export.rename(folder / f"synth_rank0_{steps}steps.sqlite")


def against_nsys_ai(exports: list[Path] | None, nsys_ai: Path, repeats: int) -> None:
    from vs_nsysai import compare

    with tempfile.TemporaryDirectory() as tmp:
        if not exports:
            exports = [H100]
            for steps in VS_STEPS:
                exports.append(synthetic_rank(steps, Path(tmp)))
                shutil.rmtree(Path(tmp) / "run")
        compare(exports, nsys_ai, repeats)
    print(load(), f"({os.cpu_count()} cores)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=160, help="steps of the synthetic rank beside nsys stats")
    parser.add_argument("--against-nsys-only", action="store_true", help="only the comparison with nsys stats")
    parser.add_argument("--vs", choices=["nsys-ai"], help="only the comparison with this tool")
    parser.add_argument("--nsys-ai", type=Path, default=Path("/tmp/nsysai-venv/bin/nsys-ai"),
                        help="the nsys-ai command, in its own venv")
    parser.add_argument("--export", type=Path, action="append", help="with --vs: these exports instead")
    args = parser.parse_args()
    print(f"SQLite reader: {sqlite_reader()}; {load()}")
    if args.vs:
        return against_nsys_ai(args.export, args.nsys_ai, args.repeats)
    if not args.against_nsys_only:
        shared_export(args.repeats)
        synthetic(args.ranks, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        big = synthetic_rank(args.steps, Path(tmp))
        shutil.rmtree(Path(tmp) / "run")
        against_nsys_stats([max(SHARED.glob("*.sqlite"), key=lambda p: p.stat().st_size), big], args.repeats)
    print(load(), f"({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
