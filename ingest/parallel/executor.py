"""Per-file work in worker processes (`traceana ingest --jobs N`) or as Ray tasks (`--executor ray`): results come
back in file order.

Workers are spawned (not forked: the parent may hold DuckDB threads), and Ray tasks run in other processes or on
other machines, so the function they run must be importable at module level and its results picklable. Each
format's task (kineto.parse_file, nsys.parse_report, ascend.parse_rank) does all of one input's work and writes its
per-event tables as Parquet into the ingest's spill folder, returning only the small rest (a CPU-only Kineto file
also its rows, as an Arrow IPC stream: :func:`to_ipc`). Both executors run the same function and return the same
results. A worker's TraceanaError ends the whole ingest with that one line; nothing is written, since the store is
written only after every file is read, and the spill folder is removed. A local worker ends with the ingest that
started it, however that ends (:func:`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pyarrow as pa

from traceana.errors import TraceanaError, first_line

T = TypeVar("T")

# Starting a worker costs its imports (~0.5 s of CPU): below this much work (bytes to parse, gunzipped), reading
# in-process is faster.
WORKER_MIN_BYTES = 64 << 20
# What a .gz file is taken to expand by when its trailer cannot tell (several members, or 4 GiB and more): the low
# end of the shared Kineto traces' 13-20x, so that a large run is not mistaken for a small one.
GZIP_RATIO = 10


@dataclass
class RayCluster:
    """Parse each file as a Ray task (`--executor ray`) on the cluster at ``address`` (as ``ray.init`` takes it;
    None: RAY_ADDRESS, else the Ray running on this machine, else one started for this ingest). Every node needs
    this traceana installed and the input files at the same paths (shared storage); the results come back to this
    process, and ``tasks_per_node`` counts where they ran (the command's note: whether the cluster was used)."""

    address: str | None = None
    timeout_s: float = 30.0  # how long to wait for the cluster to answer (`--ray-timeout`)
    tasks_per_node: Counter[str] = field(default_factory=Counter)  # Ray node id -> tasks whose result came from it


def worker_count(jobs: int | RayCluster | None, files: list[Path]) -> int | RayCluster:
    """Processes to use: ``jobs`` as asked (1 = in this process), or, unset, every core once the work (the bytes
    to parse: :func:`parse_bytes`) is large enough to pay for starting them; never more than one per file. A Ray
    cluster sizes itself."""
    if isinstance(jobs, RayCluster):
        return jobs
    if jobs is None:
        large = sum(map(parse_bytes, files)) >= WORKER_MIN_BYTES
        jobs = (os.cpu_count() or 1) if large else 1
    if jobs < 1:
        raise TraceanaError(f"--jobs {jobs}: must be at least 1")
    return min(jobs, max(len(files), 1))


def parse_bytes(file: Path) -> int:
    """The bytes a file's parse reads: its size, or a .gz file's uncompressed size, which gzip's trailer states
    (ISIZE, the last 4 bytes: the size modulo 2**32, of the last member only) at the cost of one seek. A stated
    size below the compressed size cannot be the whole (JSON gzips to a fraction of itself): several members, or
    4 GiB and more, estimated at GZIP_RATIO times the compressed size."""
    size = file.stat().st_size
    if not file.name.endswith(".gz") or size < 18:  # header 10 + trailer 8: no gzip member at all
        return size
    with file.open("rb") as handle:
        handle.seek(-4, os.SEEK_END)
        stated = int.from_bytes(handle.read(4), "little")
    return stated if stated >= size else size * GZIP_RATIO


def threads_per_task(jobs: int | RayCluster) -> int:
    """DuckDB threads for one file's task: the machine's cores shared among local workers; one per Ray task (Ray
    gives each task one CPU)."""
    return 1 if isinstance(jobs, RayCluster) else max(1, (os.cpu_count() or 1) // jobs)


def map_files(parse: Callable[[Path], T], files: list[Path], jobs: int | RayCluster) -> Iterator[T]:
    """``parse(file)`` for every file, in file order, across ``jobs`` worker processes (1: in this one), or as
    tasks on a Ray cluster."""
    if isinstance(jobs, RayCluster):
        yield from _map_ray(parse, files, jobs)
        return
    if jobs == 1:
        yield from map(parse, files)
        return
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                               initargs=(os.getpid(),))
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


def die_with_parent(parent: int) -> None:
    """A worker's first step: end when the ingest that started it ends, even by kill -9, which runs no cleanup and
    would leave the workers parsing (and holding its pipes) for minutes. On Linux the kernel kills the worker as
    its parent exits (PR_SET_PDEATHSIG); elsewhere a thread watches for the parent's end once a second."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the line above took effect
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def _call(parse: Callable[[Path], T], file: Path) -> tuple[T, str]:
    """The Ray task: one file's parse, and the id of the node that ran it (module level, so that workers import it
    rather than unpickle code)."""
    import ray

    return parse(file), ray.get_runtime_context().get_node_id()


@contextmanager
def _connected(ray: ModuleType, cluster: RayCluster) -> Iterator[None]:
    """``ray.init`` for the cluster, waited for at most ``cluster.timeout_s``, and ``ray.shutdown`` after the body.
    Ray retries an address that does not answer for a minute or more, so the call runs in a daemon thread and the
    ingest gives up on it with one line. That thread lives until the shutdown: the GCS and raylet that ``ray.init``
    starts where no Ray runs are its children with PR_SET_PDEATHSIG, which Linux sends when the *thread* that
    started them ends, so a thread that returned would kill them (the first task then waits 60 s for a GCS that is
    gone, and Ray ends the process)."""
    where = cluster.address or os.environ.get("RAY_ADDRESS")
    at = f" at {where}" if where else ""
    failed: list[BaseException] = []
    ready, done = threading.Event(), threading.Event()

    def init() -> None:
        try:
            ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        except BaseException as exc:  # handed to the waiting thread
            failed.append(exc)
            return
        finally:
            ready.set()
        done.wait()

    threading.Thread(target=init, name="ray-init", daemon=True).start()
    if not ready.wait(cluster.timeout_s):
        raise TraceanaError(f"cannot reach Ray{at} within {cluster.timeout_s:g} s (--ray-timeout)")
    if failed:
        exc = failed[0]
        if not isinstance(exc, ConnectionError | ValueError | RuntimeError):
            raise exc
        raise TraceanaError(f"cannot start or reach Ray{at} ({first_line(exc)})") from None
    try:
        yield
    finally:
        ray.shutdown()
        done.set()


def _map_ray(parse: Callable[[Path], T], files: list[Path], cluster: RayCluster) -> Iterator[T]:
    """:func:`map_files` on Ray: one task per file, results taken in file order. A Ray this ingest started (or
    connected to) is shut down (disconnected) after it; one already initialised in this process is used and left."""
    try:
        import ray
    except ModuleNotFoundError:
        raise TraceanaError("--executor ray needs Ray, which is not installed: pip install 'traceana[ray]'") from None
    with nullcontext() if ray.is_initialized() else _connected(ray, cluster):
        yield from _run_tasks(ray, parse, files, cluster.tasks_per_node)


def _run_tasks(ray: ModuleType, parse: Callable[[Path], T], files: list[Path], nodes: Counter[str]) -> Iterator[T]:
    """One task per file on the Ray this process is connected to, each counted in ``nodes`` under the node that
    ran it; a failed task is that file's one line."""
    task = ray.remote(_call)
    refs = [task.remote(parse, file) for file in files]
    try:
        for file, ref in zip(files, refs, strict=True):
            try:
                result, node = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the parse raised: its own exception, as a local worker's
                raise exc.cause from None
            except ray.exceptions.RayError as exc:  # the task's worker or node died, or its result was lost
                raise TraceanaError(f"{file}: the Ray task reading it failed ({type(exc).__name__}: "
                                    f"{first_line(exc, 160)})") from None
            nodes[node] += 1
            yield result
    except BaseException:
        # Only tasks not yet finished are cancelled, and only when the ingest ends early: cancelling a task whose
        # reply is being processed trips a check in Ray (2.60: "Tried to complete task that was not pending") that
        # ends this process. The cancelled ones are waited for, so none writes into a removed spill folder.
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in pending:
            ray.cancel(ref)
        ray.wait(pending, num_returns=len(pending))
        raise


def to_ipc(batches: pa.RecordBatchReader) -> bytes:
    """Record batches as an Arrow IPC stream, the form results cross the process boundary in."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(stream: bytes) -> pa.Table:
    return pa.ipc.open_stream(stream).read_all()
