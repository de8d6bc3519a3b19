"""Reading profiler SQLite exports (Nsight Systems, Ascend) into typed frames, whatever a column holds.

SQLite types values, not columns: an id column may hold the profilers' "none" (uint32 or uint64 -1, stored as
4294967295, as -1, or as a REAL 1.8e19 when it no longer fits an integer), text, or a float. An id that is not a
plain integer is read as unknown (NULL): that is data, not an error. A value that matters and cannot be represented
(a time, a rank) is a one-line error naming the file, the table or field and the value.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError

UNKNOWN_IDS = (4294967295, -1)  # uint32 -1 as SQLite stores it, and uint64 -1 written as signed


def unknown_id(expr: str, bits: int = 64) -> str:
    """SQL for an id column: the integer when it is one within ``bits``, else NULL (a sentinel, text, a REAL)."""
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return (f"CASE WHEN typeof({expr}) = 'integer' AND {expr} BETWEEN {low} AND {high} "
            f"AND {expr} NOT IN {UNKNOWN_IDS} THEN {expr} END")


def decode_text(raw: bytes) -> str:
    """The text factory for exports whose strings are not all valid UTF-8 (undecodable bytes become U+FFFD)."""
    return raw.decode("utf-8", "replace")


def typed_frame(rows: list[tuple], schema: dict[str, pl.DataType], path: Path, where: str) -> pl.DataFrame:
    """``rows`` as a frame of ``schema``; a value that does not fit its column is a one-line error naming the file,
    ``where`` (the table or query) and the column, never an overflow traceback."""
    try:  # column by column from the transposed rows: a third faster than a row-oriented frame
        if not rows:
            return pl.DataFrame(schema=schema)
        return pl.DataFrame([pl.Series(name, values, dtype)
                             for (name, dtype), values in zip(schema.items(), zip(*rows, strict=True), strict=True)])
    except (pl.exceptions.PolarsError, TypeError, OverflowError, ValueError):
        pass
    for index, (column, dtype) in enumerate(schema.items()):
        values = [row[index] for row in rows]
        try:
            pl.Series(column, values, dtype=dtype)
        except (pl.exceptions.PolarsError, TypeError, OverflowError, ValueError):
            bad = next((v for v in values if not _fits(v, dtype)), None)
            raise TraceanaError(f"{path}: {where} column {column} holds {bad!r}, which is not "
                                f"{_kind(dtype)}") from None
    raise TraceanaError(f"{path}: {where}: rows of mixed types that cannot be read")


def _fits(value: object, dtype: pl.DataType) -> bool:
    try:
        pl.Series([value], dtype=dtype)
    except (pl.exceptions.PolarsError, TypeError, OverflowError, ValueError):
        return False
    return True


def _kind(dtype: pl.DataType) -> str:
    if dtype.is_integer():
        bits = {pl.Int32(): 32, pl.Int64(): 64}.get(dtype, 64)
        return f"an integer of {bits} bits"
    return f"a {dtype}"
