"""Printing results: rich tables on a terminal, JSON or CSV for machines. Every command prints through here."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from traceana.errors import TraceanaError

# Piped output is not cut to 80 columns: a number a user quotes must never be elided.
console = Console() if sys.stdout.isatty() else Console(width=250)


def emit(frame: pl.DataFrame, *, title: str | None = None, fmt: str = "table") -> None:
    """Print ``frame`` as a rich table ('table'), JSON records ('json') or CSV ('csv')."""
    if fmt == "json":
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str, indent=1) + "\n")
    elif fmt == "csv":  # CSV has no nested values: lists and structs are written as their JSON text
        nested = [c for c, t in frame.schema.items() if t.is_nested()]
        flat = frame.with_columns(pl.col(c).map_elements(lambda v: json.dumps(v.to_list() if hasattr(v, "to_list")
                                  else v, default=str), return_dtype=pl.String) for c in nested)
        sys.stdout.write(flat.write_csv())
    else:
        table = Table(title=title, show_lines=False)
        for name, dtype in frame.schema.items():
            table.add_column(name, justify="right" if dtype.is_numeric() else "left", overflow="fold")
        for row in frame.iter_rows():
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
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task(label, total=total)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=f"{label} {description}")

        yield advance


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
