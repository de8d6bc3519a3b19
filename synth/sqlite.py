"""Writing the SQLite exports (nsys, Ascend): a new file from a real export's schema, and frames into its tables."""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path

import polars as pl


def create(path: Path, schema: str) -> sqlite3.Connection:
    """A new database at ``path`` with the tables of ``schema`` (a .sql file of this package)."""
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.executescript(resources.files("traceana.synth").joinpath(schema).read_text())
    return con


def insert(con: sqlite3.Connection, table: str, frame: pl.DataFrame) -> None:
    """``frame``'s rows into ``table`` by column name (the table's other columns stay NULL)."""
    columns = ", ".join(f'"{c}"' for c in frame.columns)
    marks = ", ".join("?" * frame.width)
    con.executemany(f'INSERT INTO "{table}" ({columns}) VALUES ({marks})', frame.iter_rows())
