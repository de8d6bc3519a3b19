"""traceana beside nsys-ai (the `skill run` CLI of `pip install nsys-ai`) on the same nsys SQLite exports.

nsys-ai lives in a venv of its own: it reads exports through DuckDB's sqlite_scanner, packaged on PyPI for DuckDB
1.5.5 at newest, while traceana needs DuckDB >= 2, so the two cannot share one environment. Make it once:
    python3 -m venv /tmp/nsysai-venv
    /tmp/nsysai-venv/bin/pip install nsys-ai duckdb==1.5.5 duckdb-extension-sqlite-scanner==1.5.5
and pass --nsys-ai /tmp/nsysai-venv/bin/nsys-ai (the default). Before timing, the benchmark INSTALLs the packaged
extension into that DuckDB (what DuckDB would otherwise download on first use).

Every figure is a whole command as a user types it (interpreter start and imports included), run as a subprocess,
best wall seconds of --repeats taken in turn (traceana, nsys-ai, traceana, ...). Each export is copied into a
temporary folder first: nsys-ai writes its cache beside the export (<name>.nsys-cache).
  first answer  traceana: `ingest` into a new store + `breakdown`; nsys-ai: `skill run top_kernels` with no cache
                (its default path builds the Parquet cache, then answers), and with --no-cache (queries the
                SQLite export in place), the faster of the two taken for the ratio
  analysis rows each tool on its warm path: traceana's store as ingested; nsys-ai's cache after `nsys-ai warm`
                (base tables and the NVTX kernel map)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_nsys import kernel_count, timed

MEMCPY_SQL = ("SELECT name, count(*) AS count, sum(end_ns - start_ns) / 1e6 AS total_ms FROM device_events "
              "WHERE category = 'memcpy' GROUP BY name ORDER BY total_ms DESC")

# (row, what traceana computes, its arguments after `traceana`, what nsys-ai computes, its skill)
ROWS = [
    ("top kernels", "kernels by total time, all ranks: calls, mean, max, share of COMP", ["kernels", "--json"],
     "kernels by total time, all devices: count, avg, min, max, Tensor Core use", "top_kernels"),
    ("idle gaps", "IDLE per rank split by cause (host launch, sync, queued)", ["idle", "--json"],
     "gaps >= 1 ms between kernels per stream of device 0, with the CPU APIs in the top gaps", "gpu_idle_gaps"),
    ("overlap", "per rank COMP, exposed comm by dim, IDLE, overlapped comm", ["breakdown", "--json"],
     "device 0: compute-only, NCCL-only, overlap, idle", "overlap_breakdown"),
    ("memory transfers", "memcpy count and time by direction (`traceana sql`; the store keeps no bytes)",
     ["sql", MEMCPY_SQL, "--format", "json"], "memcpy count, MB and time by direction", "memory_transfers"),
    ("launch overhead", "launch-to-start delay per kernel (p50/p95/max), share shorter than the launch cost",
     ["kernels", "--launch", "--json"], "kernels < 10 us with >= 100 launches on device 0: API and queue time",
     "kernel_launch_overhead"),
    ("NVTX breakdown", "device time by NVTX range path: COMP, exposed comm, kernels, top kernel",
     ["ops", "--by", "nvtx", "--json"], "kernels attributed to NVTX regions: GPU time, compute/NCCL, top 3",
     "nvtx_layer_breakdown"),
]

INSTALL_EXTENSION = """
import glob, duckdb
try:
    import duckdb_extension_sqlite_scanner as packaged
except ImportError:
    raise SystemExit(0)  # DuckDB downloads the extension on first use where it can
path = glob.glob(packaged.__path__[0] + "/extensions/*/sqlite_scanner.duckdb_extension")[0]
duckdb.connect().execute(f"INSTALL '{path}'")
"""


def wall(command: list[str], cwd: Path) -> float:
    return timed(command, cwd)[0]


def install_extension(nsys_ai: Path) -> None:
    """INSTALL the packaged sqlite_scanner into nsys-ai's DuckDB: untimed, as if a first run had downloaded it."""
    subprocess.run([str(nsys_ai.with_name("python")), "-c", INSTALL_EXTENSION], check=True)


def first_answer(export: Path, traceana: str, nsys_ai: str, repeats: int, cwd: Path) -> tuple[float, float, float]:
    """Best seconds of traceana's ingest + breakdown, nsys-ai's cache build + top_kernels, and nsys-ai's
    top_kernels on the SQLite export in place."""
    store, cache = cwd / "first.duckdb", export.with_suffix(".nsys-cache")
    skill = [nsys_ai, "skill", "run", "top_kernels", str(export), "--format", "json"]
    best = [float("inf")] * 3
    for _ in range(repeats):
        store.unlink(missing_ok=True)
        ours = wall([traceana, "ingest", str(export), "--db", str(store)], cwd)
        ours += wall([traceana, "breakdown", "--db", str(store), "--json"], cwd)
        shutil.rmtree(cache, ignore_errors=True)
        built = wall(skill, cwd)
        direct = wall([*skill, "--no-cache"], cwd)
        best = [min(b, t) for b, t in zip(best, (ours, built, direct), strict=True)]
    store.unlink(missing_ok=True)
    return best[0], best[1], best[2]


def compare(exports: list[Path], nsys_ai: Path, repeats: int) -> None:
    """Print the table: one block per export, the first-answer row, then the analysis rows."""
    traceana = str(Path(sys.executable).with_name("traceana"))
    install_extension(nsys_ai)
    print(f"\ntraceana beside nsys-ai (best wall seconds of {repeats}, each a whole command; ratio = traceana / "
          "nsys-ai, below 1 traceana faster)")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for source in exports:
            export = cwd / source.name
            shutil.copyfile(source, export)
            print(f"\n{source.name}: {kernel_count([export]):,} kernels, {export.stat().st_size / 1e6:.0f} MB")
            print(f"{'row':<18}{'traceana s':>11}{'nsys-ai s':>11}{'ratio':>7}  nsys-ai --no-cache s")
            ours, built, direct = first_answer(export, traceana, str(nsys_ai), repeats, cwd)
            print(f"{'first answer':<18}{ours:>11.2f}{built:>11.2f}{ours / min(built, direct):>7.2f}  {direct:.2f}")
            store = cwd / "warm.duckdb"
            subprocess.run([traceana, "ingest", str(export), "--db", str(store)], check=True, capture_output=True)
            subprocess.run([str(nsys_ai), "warm", str(export)], check=True, capture_output=True)
            for row, _, args, _, skill in ROWS:
                best = [float("inf")] * 2
                for _ in range(repeats):
                    times = (wall([traceana, *args, "--db", str(store)], cwd),
                             wall([str(nsys_ai), "skill", "run", skill, str(export), "--format", "json"], cwd))
                    best = [min(b, t) for b, t in zip(best, times, strict=True)]
                print(f"{row:<18}{best[0]:>11.2f}{best[1]:>11.2f}{best[0] / best[1]:>7.2f}")
            store.unlink()
            shutil.rmtree(export.with_suffix(".nsys-cache"))
            export.unlink()
    print("\nwhat each row computes (traceana | nsys-ai):")
    for row, ours_what, args, theirs_what, skill in ROWS:
        shown = " ".join(a if " " not in a else "'<SQL>'" for a in args)
        print(f"  {row}: `traceana {shown}`: {ours_what} | `skill run {skill}`: {theirs_what}")
