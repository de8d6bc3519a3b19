"""The timing loops the ingest benchmarks share: best of N for parsing (read_run) and for the whole ingest, and the
synthetic multi-rank runs (``traceana synth``) timed per phase with 1 and 2 worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from traceana import store
from traceana.ingest.dispatch import IngestOptions, ReadProgress, read_run
from traceana.ingest.run_data import RunData

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "synth_gpt_tp2pp2.yaml"


def time_ingest(paths: list[Path], fmt: str, repeats: int) -> tuple[float, float, RunData]:
    """(best seconds of read_run, best seconds of read_run + store write, the parsed run)."""
    best_read = best_total = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            data = read_run(paths, fmt, IngestOptions())
            parsed = time.perf_counter()
            with store.connect(Path(tmp) / "bench.duckdb") as con:
                store.write_run(con, "bench", data)
            done = time.perf_counter()
        best_read, best_total = min(best_read, parsed - start), min(best_total, done - start)
    return best_read, best_total, data


def synthesize(fmt: str, ranks: int, folder: Path, steps: int = 8, kernel_us: float = 3) -> Path:
    """A synthetic run of ``ranks`` ranks (by default 8 steps, 3 µs kernels: ~38k device ops per rank) written by
    `traceana synth` into ``folder``; returns the folder of traces."""
    command = [sys.executable, "-m", "traceana", "synth", str(CONFIG), str(folder), "--ranks", str(ranks),
               "--steps", str(steps), "--kernel-us", str(kernel_us), "--format", fmt]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return folder / "traces"


class _FilesRead(ReadProgress):
    """Notes when the ingester moves on from reading its files (its first phase)."""

    def __init__(self) -> None:
        self.done: float | None = None

    def phase(self, name: str) -> None:
        self.done = self.done or time.perf_counter()


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the worker processes, once shut down)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def time_phases(folder: Path, fmt: str, jobs: int, repeats: int) -> tuple[float, float, float, RunData]:
    """Best seconds of reading the files (the per-file work, in ``jobs`` worker processes) and of the whole
    read_run (files, then ranks, clocks, steps and collectives across them), the CPU seconds of that best read_run
    (workers included: on a shared machine the steadier figure), and the parsed run."""
    best_files = best_run = float("inf")
    cpu = 0.0
    for _ in range(repeats):
        progress = _FilesRead()
        start, start_cpu = time.perf_counter(), _cpu()
        data = read_run([folder], fmt, IngestOptions(jobs=jobs, progress=progress))
        done = time.perf_counter()
        best_files = min(best_files, (progress.done or done) - start)
        if done - start < best_run:
            best_run, cpu = done - start, _cpu() - start_cpu
    return best_files, best_run, cpu, data


def print_phases(folder: Path, fmt: str, repeats: int, megabytes: float, count: int, unit: str) -> None:
    """The table of :func:`time_phases` with 1 and 2 workers: seconds, MB/s and ``unit`` (of ``count``) per second."""
    print(f"{'jobs':<6}{'stage':<16}{'seconds':>9}{'MB/s':>9}{unit + '/s':>12}")
    for jobs in (1, 2):
        files, whole, cpu, _ = time_phases(folder, fmt, jobs, repeats)
        for stage, seconds in (("files read", files), ("read_run", whole), ("read_run CPU", cpu)):
            print(f"{jobs:<6}{stage:<16}{seconds:>9.3f}{megabytes / seconds:>9.1f}{count / seconds:>12,.0f}")


def sqlite_reader() -> str:
    """Which SQLite reader the nsys and Ascend database ingest uses here."""
    try:
        return f"native (adbc-driver-sqlite {metadata.version('adbc-driver-sqlite')})"
    except metadata.PackageNotFoundError:
        return "sqlite3 rows (adbc-driver-sqlite not installed)"


def load() -> str:
    return "load average " + " / ".join(f"{v:.1f}" for v in os.getloadavg())
