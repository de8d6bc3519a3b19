"""Printing results: rich tables on a terminal, JSON or CSV for machines. Every command prints through here."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from traceana.errors import TraceanaError

if TYPE_CHECKING:  # imported where used: a command that prints a few rows must not pay for Polars
    import polars as pl
    from rich.progress import Progress, TaskID

# Piped output is not cut to 80 columns: a number a user quotes must never be elided. COLUMNS, where set, says the
# width a pipe's reader has (the docs' examples are printed at 100 columns).
console = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS") or 250))


def emit(frame: pl.DataFrame, *, title: str | None = None, fmt: str = "table", keys: int = 1) -> None:
    """Print ``frame`` as a rich table ('table'), JSON records ('json') or CSV ('csv'); ``keys``: how many leading
    columns name a row (repeated in each part of a table too wide for the terminal, :func:`emit_rows`)."""
    if fmt == "json":
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str, indent=1) + "\n")
    elif fmt == "csv":  # CSV has no nested values: lists and structs are written as their JSON text
        import polars as pl

        nested = [c for c, t in frame.schema.items() if t.is_nested()]
        flat = frame.with_columns(pl.col(c).map_elements(lambda v: json.dumps(v.to_list() if hasattr(v, "to_list")
                                  else v, default=str), return_dtype=pl.String) for c in nested)
        sys.stdout.write(flat.write_csv())
    else:
        emit_rows(frame.columns, list(frame.iter_rows()), [t.is_numeric() for t in frame.dtypes], title=title,
                  keys=keys)


TEXT_WIDTH = 40  # a text cell longer than this wraps (at spaces where it has them); a number never does


def emit_rows(columns: list[str], rows: list[tuple], numeric: list[bool], *, title: str | None = None,
              fmt: str = "table", keys: int = 1) -> None:
    """Print rows (a query's result) as :func:`emit` prints a frame, without building one (table or json).

    A number is never cut or wrapped; each column's numbers print as :func:`column_text` writes them, and byte
    counts in the unit the table's largest calls for, named in their headers (:func:`_in_bytes_unit`); JSON keeps
    the raw values. Headers wrap at their spaces. A table wider than the terminal is printed in parts, each with the
    first ``keys`` columns and as many of the others, in order, as fit."""
    if fmt == "json":
        emit_json([dict(zip(columns, row, strict=True)) for row in rows])
        return
    from rich.table import Table

    values = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in columns]
    columns, values = _in_bytes_unit(columns, values, numeric)
    texts = [column_text(column, name) for name, column in zip(columns, values, strict=True)]
    cells = [list(row) for row in zip(*texts, strict=True)]
    widths = [max([max(map(len, name.split()), default=1)] + [min(len(c[i]), TEXT_WIDTH if not right else len(c[i]))
                                                              for c in cells])
              for i, (name, right) in enumerate(zip(columns, numeric, strict=True))]
    for part, shown in enumerate(_parts(widths, min(keys, len(columns)), console.width)):
        heading = title if part == 0 or title is None else f"{title} (continued)"
        table = Table(title=heading, show_lines=False)
        # where the part fits only with its headers wrapped, wrap them (rich would rather cut a cell)
        wrap = 1 + sum(max(widths[i], len(columns[i])) + 3 for i in shown) > console.width
        for i in shown:
            table.add_column(columns[i], justify="right" if numeric[i] else "left", min_width=widths[i],
                             max_width=widths[i] if wrap else None, overflow="fold")
        for row in cells:
            table.add_row(*(row[i] for i in shown))
        console.print(table)


# A column counts things (calls, events ...) when its name starts with one of these; a mean of counts per rank-step
# may have a fraction, but its whole values print as the integers they are
COUNTS = frozenset({"calls", "events", "messages", "instances", "gaps", "steps", "ranks", "samples", "kernels"})
MAX_DECIMALS = 3


def _is_bytes(column: str) -> bool:
    """A byte count: a column named bytes or with bytes among its words (size_bytes, bytes_A), not a percentage."""
    return "bytes" in column.split("_") and not column.endswith("_pct")


def _in_bytes_unit(columns: list[str], values: list[list[Any]], numeric: list[bool]
                   ) -> tuple[list[str], list[list[Any]]]:
    """The byte columns in the binary unit (units.BINARY_BYTES) the table's largest byte count calls for, one unit
    for all of them so that they compare at a glance, the unit replacing "bytes" in their names (size_bytes ->
    size_MiB); a table whose byte counts are all under 1 KiB keeps them as they are."""
    from traceana.render.units import BINARY_BYTES, unit_for

    sized = [i for i, name in enumerate(columns) if numeric[i] and _is_bytes(name)]
    largest = max((abs(float(v)) for i in sized for v in values[i] if _is_number(v) and math.isfinite(v)), default=0)
    unit, factor, _ = unit_for(largest, BINARY_BYTES)
    if factor == 1:
        return columns, values
    columns, values = list(columns), list(values)
    for i in sized:
        columns[i] = "_".join(unit if word == "bytes" else word for word in columns[i].split("_"))
        values[i] = [float(v) / factor if _is_number(v) else v for v in values[i]]
    return columns, values


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def column_text(values: list[Any], name: str = "") -> list[str]:
    """The cells of one column. Integers as they are; floats with one number of decimals for the whole column: as
    many as give its smallest nonzero magnitude 3 significant digits (at least 1, at most 3), less the trailing zeros
    every cell has. A column of floats that are all whole (a mean of counts) prints as integers, and so does each
    whole value of a column of counts (``name`` starts with a word of COUNTS). Text, lists and blanks as they are."""
    floats = [float(v) for v in values if isinstance(v, float | Decimal)]
    counts = name.split("_")[0] in COUNTS and not name.endswith("_pct")
    whole = all(v.is_integer() for v in floats)
    fractions = [v for v in floats if not (counts and v.is_integer())]
    nonzero = [abs(v) for v in fractions if v and math.isfinite(v)]
    decimals = min(MAX_DECIMALS, max(1, 2 - math.floor(math.log10(min(nonzero))))) if nonzero else 1
    while decimals > 1 and all(f"{v:.{decimals}f}".endswith("0") for v in fractions if math.isfinite(v)):
        decimals -= 1

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float | Decimal) and not isinstance(value, bool):
            number = float(value)
            if whole or (counts and number.is_integer()):
                return f"{int(number):,}"
            return f"{number:,.{decimals}f}"
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)

    return [cell(v) for v in values]


def _parts(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """The columns of each part of a table ``width`` characters wide: the key columns, then the next columns that
    fit (a rich cell costs its width plus 3, the table 1 more); at least one column beyond the keys per part."""
    parts: list[list[int]] = []
    base = 1 + sum(w + 3 for w in widths[:keys])
    current, used = list(range(keys)), base
    for i in range(keys, len(widths)):
        if used + widths[i] + 3 > width and len(current) > keys:
            parts.append(current)
            current, used = list(range(keys)), base
        current.append(i)
        used += widths[i] + 3
    parts.append(current)
    return parts


def emit_json(payload: Any) -> None:
    """An object gets ``traceana_version`` first, so a saved result names what made it; a table's records (a JSON
    array, as `sql --format json` prints) stay an array that scripts index directly."""
    if isinstance(payload, dict):
        from traceana.about import version

        payload = {"traceana_version": version(), **payload}
    sys.stdout.write(json.dumps(payload, default=str, indent=1) + "\n")


def with_shares(values: list[Any], shares: list[float | None], name: str = "") -> list[str]:
    """'value (share%)' cells: the values as :func:`column_text` prints their column, each share to 1 decimal; a
    blank share (no total to divide by, or a row that gives none) leaves the value alone."""
    return [text if share is None or not math.isfinite(share) else f"{text} ({share:.1f}%)"
            for text, share in zip(column_text(values, name), shares, strict=True)]


def with_intervals(values: list[Any], lows: list[Any], highs: list[Any]) -> list[str]:
    """'value [low, high]' cells, the three with one number of decimals (:func:`column_text` of them together)."""
    n = len(values)
    texts = column_text([*values, *lows, *highs])
    return [f"{v} [{low}, {high}]" for v, low, high in zip(texts[:n], texts[n:2 * n], texts[2 * n:], strict=True)]


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


def _writable(option: str, path: Path, what: str, kind: str, types: tuple[str, ...]) -> Path:
    """``path`` as a ``kind`` file (one of ``types``) in a folder that exists and can be written, checked before any
    work; ``what`` names the thing written in the errors."""
    try:
        is_dir, folder_exists = path.is_dir(), path.parent.is_dir()
        path.resolve()
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop
        raise TraceanaError(f"{option} {path}: cannot write the {what} ({getattr(exc, 'strerror', None) or exc})") \
            from None
    if is_dir:
        raise TraceanaError(f"{option} {path}: is a folder; give a file name ending in {types[0]}")
    if path.suffix.lower() not in types:
        raise TraceanaError(f"{option} {path}: unknown {kind} type {path.suffix or '(no extension)'}; "
                            f"use {', '.join(types)}")
    if not folder_exists:
        raise TraceanaError(f"{option} {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise TraceanaError(f"{option} {path}: cannot write in {path.parent}")
    return path


def plot_path(path: Path | None) -> Path | None:
    """The callback of every --plot: an image file name in a folder that exists and can be written, checked before
    any work is done (matplotlib would add .png to a folder's name, or fail only at the end)."""
    return None if path is None else _writable("--plot", path, "plot", "image", IMAGE_TYPES)


def html_path(path: Path | None) -> Path | None:
    """The callback of every --html: an .html file in a folder that exists and can be written, checked before the
    report is computed (that takes seconds; the write would fail only at the end)."""
    return None if path is None else _writable("--html", path, "page", "page", (".html", ".htm"))
