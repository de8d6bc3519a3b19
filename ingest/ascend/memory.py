"""Ascend memory samples -> the store's ``memory`` table: what the PyTorch allocator (component PTA) held.

The profiler records every allocator change per component; PTA is torch_npu's caching allocator, the counterpart of
torch.cuda's allocated / reserved. Its "MB" are MiB (totalAllocated bytes / 2**20 in the database export)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from traceana.errors import first_line

SCHEMA = {"ts_ns": pl.Int64(), "allocated_bytes": pl.Int64(), "reserved_bytes": pl.Int64()}
EMPTY = pl.DataFrame(schema=SCHEMA)


def memory_from_csv(path: Path, notes: list[str]) -> pl.DataFrame:
    """PTA rows of memory_record.csv (Timestamp(us) as text with three decimals, read exactly). Memory is an
    extra: a file that cannot be read (broken rows, missing columns, not UTF-8) is left out with a note."""
    if not path.is_file():
        return EMPTY
    source = str(path).replace("'", "''")
    try:
        return _read_csv(source)
    except (duckdb.Error, OSError, UnicodeDecodeError) as exc:
        notes.append(f"{path}: memory samples left out, the file is not readable ({first_line(exc, 120)})")
        return EMPTY


def _read_csv(source: str) -> pl.DataFrame:
    return duckdb.sql(f"""
        SELECT CAST(CAST(trim("Timestamp(us)") AS DECIMAL(24, 3)) * 1000 AS BIGINT) AS ts_ns,
               CAST(round("Total Allocated(MB)" * 1048576) AS BIGINT) AS allocated_bytes,
               CAST(round("Total Reserved(MB)" * 1048576) AS BIGINT) AS reserved_bytes
        FROM read_csv('{source}', header = true, all_varchar = false,
                      types = {{'Timestamp(us)': 'VARCHAR', 'Total Allocated(MB)': 'DOUBLE',
                               'Total Reserved(MB)': 'DOUBLE'}})
        WHERE Component = 'PTA' ORDER BY ts_ns""").pl().cast(SCHEMA)  # type: ignore[arg-type]
