"""The timing loop the ingest benchmarks share: best of N for parsing (read_run) and for the whole ingest."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from traceana import store
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.run_data import RunData


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
