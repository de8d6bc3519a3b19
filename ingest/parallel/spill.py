"""The spill: one ingest's per-event tables as Parquet parts in a folder beside the store, one part per input file,
written by the worker that parsed the file. The store streams them in (``Spill.select_sql``), adding each part's
rank and clock shift, so that a run is never held in memory whole. The folder goes on every path: with the run's
RunData once the store write is done, or as soon as reading the run fails."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.run_data import SCHEMAS, SPILLED, TIME_COLUMNS, RunData, conform
from traceana.ingest.validate import Dropped, check


class Spill:
    """A folder of Parquet parts, ``<folder>/<table>/<key>.parquet``, each one input file's rows of a
    SPILLED table (store columns without ``rank``); ``parts`` (key, rank, shift) says whose rows each part
    holds and the ns to add to their times. The folder is removed by :meth:`remove`, or when the object goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.parts = pl.DataFrame(schema={"key": pl.String(), "rank": pl.Int32(), "shift": pl.Int64()})
        self._remove = weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)

    def remove(self) -> None:
        self._remove()

    def glob(self, table: str) -> str | None:
        """The Parquet files of ``table`` as a read_parquet pattern, or None when no part has rows of it."""
        return str(self.folder / table / "*.parquet") if any((self.folder / table).glob("*.parquet")) else None

    def select_sql(self, table: str, pattern: str) -> str:
        """SELECT of ``table``'s store columns (without run_id) from its Parquet, ranked and shifted by ``parts``
        (registered as ``spill_parts``)."""
        cols = ["p.rank" if c == "rank" else f"t.{c} + p.shift AS {c}" if c in TIME_COLUMNS[table] else f"t.{c}"
                for c in SCHEMAS[table]]
        pattern = pattern.replace("'", "''")
        return (f"SELECT {', '.join(cols)} FROM read_parquet('{pattern}', filename = true) t "
                "JOIN spill_parts p ON p.key = parse_filename(t.filename, true)")


def spill_part(folder: Path, table: str, key: str, frame: pl.DataFrame) -> None:
    """One file's rows of ``table`` (store columns; ``rank`` comes from the parts) as part ``key`` of a Spill,
    written under another name and renamed: a Ray task killed mid-write (its node lost; Ray runs it again under a new
    key) leaves no cut-short part for the store's read of ``*.parquet`` to fail on. A full disk is the store's one
    line (the spill is beside it), as when the store's own write fills it."""
    if frame.is_empty():
        return
    try:
        (folder / table).mkdir(parents=True, exist_ok=True)
        part = folder / table / f"{key}.parquet"
        writing = part.with_suffix(".writing")
        conform(table, frame).drop("rank").write_parquet(writing, compression="lz4", statistics=False)
        writing.replace(part)
    except (OSError, pl.exceptions.ComputeError) as exc:
        if "No space left on device" not in str(exc):
            raise
        store = folder.parent / folder.name.split(".ingest-")[0]  # spill_folder's name for it
        raise TraceanaError(f"{store}: no space left on device; the store is unchanged") from None


def spill_folder(near: Path) -> Path:
    """A new empty folder for one ingest's Parquet parts next to ``near`` (the store), named after it: made before
    any file is read, so a store in a folder that cannot be written is said at once."""
    try:
        near.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{near.name}.ingest-{os.getpid()}-", dir=near.parent))
    except OSError as exc:
        raise TraceanaError(f"{near}: cannot write in {near.parent} ({exc.strerror or exc}), where the store and "
                            "its ingest's spill folder go; the store is unchanged") from None


@contextmanager
def new_spill(near: Path) -> Iterator[Spill]:
    """A :class:`Spill` for one ingest's parts, next to ``near`` (the store); removed if reading the run fails (on
    success the RunData carries it, and the store write or its caller removes it)."""
    spill = Spill(spill_folder(near))
    try:
        yield spill
    except BaseException:
        spill.remove()
        raise


def spill_file(folder: Path, source_format: str, source: str, frames: dict[str, pl.DataFrame], *,
               per_rank: bool = False) -> tuple[dict[str, pl.DataFrame], str, Dropped]:
    """One input file's rows, validated (validate.check: rows no store row may be are left out and counted), and its
    SPILLED tables written into ``folder``: as part ``key``, or with ``per_rank`` as one part ``key-<rank>`` per
    rank the file holds (an nsys report's processes and devices). Returns the checked frames (the reader keeps the
    compact tables and the collectives' rows of them), the key, and what was left out."""
    data = RunData(source_format, [source], 1, frames=frames)
    dropped = check(data)
    key = uuid.uuid4().hex
    for table in SPILLED:
        if (frame := data.frames.get(table)) is None:
            continue
        if per_rank:
            for (rank,), part in frame.partition_by("rank", as_dict=True).items():
                spill_part(folder, table, f"{key}-{rank}", part)
        else:
            spill_part(folder, table, key, frame)
    return data.frames, key, dropped
