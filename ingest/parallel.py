"""Per-file work in worker processes (`traceana ingest --jobs N`): results come back in file order.

Workers are spawned (not forked: the parent may hold DuckDB threads), so the function they run must be importable
at module level and its results picklable. Kineto's (kineto.parse_file) does all of one file's work and writes its
per-event tables as Parquet into the ingest's spill folder, returning only the small rest (a CPU-only file also its
rows, as an Arrow IPC stream: :func:`to_ipc`); nsys returns its frames pickled (which Polars does as IPC). A
worker's TraceanaError ends the whole ingest with that one line; nothing is written, since the store is written only
after every file is read, and the spill folder is removed.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from traceana.errors import TraceanaError

T = TypeVar("T")

# Starting a worker costs its imports (~0.5 s of CPU): below this much input, reading in-process is faster.
WORKER_MIN_BYTES = 64 << 20


def worker_count(jobs: int | None, files: list[Path]) -> int:
    """Processes to use: ``jobs`` as asked (1 = in this process), or, unset, every core once the input is large
    enough to pay for starting them; never more than one per file."""
    if jobs is None:
        large = sum(f.stat().st_size for f in files) >= WORKER_MIN_BYTES
        jobs = (os.cpu_count() or 1) if large else 1
    if jobs < 1:
        raise TraceanaError(f"--jobs {jobs}: must be at least 1")
    return min(jobs, max(len(files), 1))


def map_files(parse: Callable[[Path], T], files: list[Path], jobs: int) -> Iterator[T]:
    """``parse(file)`` for every file, in file order, across ``jobs`` worker processes (1: in this one)."""
    if jobs == 1:
        yield from map(parse, files)
        return
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(parse, file) for file in files]
        for file, future in zip(files, futures, strict=True):
            try:
                yield future.result()
            except BrokenProcessPool:
                raise TraceanaError(f"{file}: the worker process reading it died (out of memory?); "
                                    "try fewer --jobs") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def to_ipc(batches: pa.RecordBatchReader) -> bytes:
    """Record batches as an Arrow IPC stream, the form results cross the process boundary in."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(stream: bytes) -> pa.Table:
    return pa.ipc.open_stream(stream).read_all()
