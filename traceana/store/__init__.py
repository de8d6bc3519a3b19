"""The store: every run's tables (schema.sql) and the views over them (queries/*.sql), in one DuckDB file
(database.py) or a Parquet dataset folder (dataset.py, which builds on database.py). Ingest writes a run with
``write_run``; every command opens the store with ``connect`` below, which picks the kind from ``--db``.
schema.py says what a store holds and checks that a database has it."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from traceana.errors import TraceanaError
from traceana.store import database, dataset
from traceana.store.database import (
    forget,
    materialize,
    open_run,
    resolve_run,
    restrict_to_run,
    show_every_run,
    transaction,
    write_run,
)
from traceana.store.schema import OUTDATED

if TYPE_CHECKING:
    import duckdb

__all__ = ["DEFAULT_DB", "OUTDATED", "check_path", "check_writer", "connect", "forget", "materialize", "open_run",
           "remove_leftovers", "resolve_run", "restrict_to_run", "show_every_run", "transaction", "write_run"]

DEFAULT_DB = "traceana.duckdb"


def check_path(path: Path) -> bool:
    """Whether the store exists, after making sure ``path`` can name one (not a symlink loop)."""
    try:
        path.resolve()
        exists = path.exists()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python < 3.13
        raise TraceanaError(f"{path}: cannot use as --db ({getattr(exc, 'strerror', None) or exc})") from None
    return exists


@contextmanager
def connect(db: str | Path = DEFAULT_DB, *, read_only: bool = False,
            views: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store ``db`` names: a Parquet dataset (a folder, or a name ending in .parquet) or a DuckDB file,
    with the same guarantees (database.connect, dataset.connect). A read-only open needs the store to exist."""
    path = Path(db)
    if not check_path(path) and read_only:
        raise TraceanaError(f"{path}: no such database (run `traceana ingest` first, or pass --db)")
    opened = dataset.connect if dataset.is_dataset(path) else database.connect
    with opened(path, read_only=read_only, views=views) as con:
        yield con


def check_writer(db: Path) -> None:
    """What would refuse a writer of the store ``db`` at its end, said before it reads its inputs (minutes on a big
    run): a .duckdb file that another process holds (a reader or a writer, named), or that is not a store; a
    dataset read-only for this user. A .duckdb file opened for writing and closed unchanged keeps its bytes."""
    if dataset.is_dataset(db):
        dataset.check_writable(db)
    elif db.exists():
        with database.connect(db, read_only=False, views=False):
            pass


def remove_leftovers(db: Path) -> list[str]:
    """Remove what writers of the store ``db`` that were killed (kill -9, out of memory, a power cut) left beside
    it, and return the names: an ingest's spill folder (``<db>.ingest-<pid>-*``, ingest/parallel/spill.py) and a dataset
    write's buffer, new or old version (``.<db>.buffer-<pid>-*``, ``.partial-<pid>``, ``.old-<pid>``: dataset.py).
    Each goes only once no process with the id in its name runs on this machine; a live writer's stays."""
    name = re.escape(db.name)
    pattern = re.compile(rf"(?:{name}\.ingest|\.{name}\.(?:buffer|partial|old))-(\d+)(?:-.*)?")
    removed = []
    for path in sorted(db.parent.iterdir()) if db.parent.is_dir() else []:
        if (found := pattern.fullmatch(path.name)) and path.is_dir() and not _running(int(found[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none with that id (OverflowError: none can have it)
        return False
    except PermissionError:  # another user's
        return True
    return True
