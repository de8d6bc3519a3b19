"""Printing results: rich tables on a terminal, JSON or CSV for machines. Every command prints through here."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from traceana.errors import TraceanaError

if TYPE_CHECKING:  # imported where used: a command that prints a few rows must not pay for Polars
    import polars as pl
    from rich.progress import Progress, TaskID

# Piped output is not cut to 80 columns: a number a user quotes must never be elided.
console = Console() if sys.stdout.isatty() else Console(width=250)


def emit(frame: pl.DataFrame, *, title: str | None = None, fmt: str = "table") -> None:
    """Print ``frame`` as a rich table ('table'), JSON records ('json') or CSV ('csv')."""
    if fmt == "json":
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str, indent=1) + "\n")
    elif fmt == "csv":  # CSV has no nested values: lists and structs are written as their JSON text
        import polars as pl

        nested = [c for c, t in frame.schema.items() if t.is_nested()]
        flat = frame.with_columns(pl.col(c).map_elements(lambda v: json.dumps(v.to_list() if hasattr(v, "to_list")
                                  else v, default=str), return_dtype=pl.String) for c in nested)
        sys.stdout.write(flat.write_csv())
    else:
        emit_rows(frame.columns, list(frame.iter_rows()), [t.is_numeric() for t in frame.dtypes], title=title)


def emit_rows(columns: list[str], rows: list[tuple], numeric: list[bool], *, title: str | None = None,
              fmt: str = "table") -> None:
    """Print rows (a query's result) as :func:`emit` prints a frame, without building one (table or json)."""
    if fmt == "json":
        emit_json([dict(zip(columns, row, strict=True)) for row in rows])
        return
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for name, right in zip(columns, numeric, strict=True):
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)


def emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, default=str, indent=1) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.1f}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


@contextmanager
def progress(total: int | None, label: str) -> Iterator[Callable[[str], None]]:
    """A progress bar on a terminal (silent when piped; a count without a bar when ``total`` is unknown); yields
    ``advance(description)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task(label, total=total)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=f"{label} {description}")

        yield advance


class IngestProgress:
    """The ingest bar (ingest.dispatch.ReadProgress): files and bytes read of those announced, then each phase of
    the work after reading by name. Silent when stderr is not a terminal."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._task: TaskID = bar.add_task("finding input files", total=None, files="")
        self._count = self._done = 0

    def files(self, paths: list[Path]) -> None:
        self._count = len(paths)
        self._bar.update(self._task, total=sum(p.stat().st_size for p in paths), completed=0,
                         description="reading", files=f"0/{self._count} files")

    def read(self, path: Path) -> None:
        self._done += 1
        self._bar.update(self._task, advance=path.stat().st_size, description=f"read {path.name}",
                         files=f"{self._done}/{self._count} files")

    def phase(self, name: str) -> None:
        self._bar.update(self._task, description=name)


@contextmanager
def ingest_progress() -> Iterator[IngestProgress]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as bar:
        yield IngestProgress(bar)


IMAGE_TYPES = (".png", ".svg", ".pdf")


def plot_path(path: Path | None) -> Path | None:
    """The callback of every --plot: an image file name in a folder that exists and can be written, checked before
    any work is done (matplotlib would add .png to a folder's name, or fail only at the end)."""
    if path is None:
        return None
    try:
        is_dir, folder_exists = path.is_dir(), path.parent.is_dir()
        path.resolve()
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop
        raise TraceanaError(f"--plot {path}: cannot write the plot ({getattr(exc, 'strerror', None) or exc})") from None
    if is_dir:
        raise TraceanaError(f"--plot {path}: is a folder; give a file name ending in .png")
    if path.suffix.lower() not in IMAGE_TYPES:
        raise TraceanaError(f"--plot {path}: unknown image type {path.suffix or '(no extension)'}; "
                            f"use {', '.join(IMAGE_TYPES)}")
    if not folder_exists:
        raise TraceanaError(f"--plot {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise TraceanaError(f"--plot {path}: cannot write in {path.parent}")
    return path
