"""A store as a Parquet dataset and back: one folder per table, Hive-partitioned by run (and rank), so Spark, DuckDB
or Polars read any table, or one run's or rank's part of it, without the .duckdb file.

Layout: ``DIR/schema.sql`` (the store's CREATE TABLE statements), ``DIR/{table}/run_id={id}/rank={r}/*.parquet`` for
tables with a rank column, ``DIR/{table}/run_id={id}/*.parquet`` for the other run tables, and the same by
``estimate_id`` for the estimator's tables. Partition columns live in the paths only (as Spark expects), so a
reader restores their types from schema.sql. Export writes a hidden sibling folder and renames it into place;
import replaces the runs and estimates the dataset holds in one transaction: either path is all or nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from traceana import store
from traceana.errors import TraceanaError

if TYPE_CHECKING:
    import duckdb

KEYS = ("run_id", "estimate_id")  # what a table's rows belong to; export partitions by it, import replaces by it
SCHEMA_FILE = "schema.sql"


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def _tables(con: duckdb.DuckDBPyConnection) -> list[tuple[str, list[str], str]]:
    """(table, columns, CREATE statement) of every base table of the store, in creation order."""
    rows = con.execute("SELECT table_name, sql FROM duckdb_tables() WHERE NOT temporary AND schema_name = 'main' "
                       "ORDER BY table_oid").fetchall()
    return [(name, [c[0] for c in con.execute(f'DESCRIBE "{name}"').fetchall()], sql) for name, sql in rows]


def export(con: duckdb.DuckDBPyConnection, target: Path, replace: bool = False,
           progress: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Write every table of the store at ``con`` under ``target``; returns rows per table."""
    if target.exists() and not replace:
        raise TraceanaError(f"{target}: already exists (pass --replace to overwrite it)")
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    counts: dict[str, int] = {}
    try:
        tables = _tables(con)
        (partial / SCHEMA_FILE).write_text("".join(f"{sql};\n" for _, _, sql in tables))
        for name, columns, _ in tables:
            counts[name] = con.execute(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
            by = [c for c in (*KEYS, "rank") if c in columns]
            if counts[name] and by:  # an empty table is its folder-less absence; schema.sql still declares it
                con.execute(f"""COPY "{name}" TO '{_sql_path(partial / name)}'
                                (FORMAT parquet, PARTITION_BY ({", ".join(by)}))""")
            elif counts[name]:
                (partial / name).mkdir()
                con.execute(f"""COPY "{name}" TO '{_sql_path(partial / name / "data.parquet")}' (FORMAT parquet)""")
            progress(name)
        _move_into_place(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return counts


def _move_into_place(partial: Path, target: Path) -> None:
    """Rename ``partial`` to ``target``; an existing ``target`` is set aside first and removed after."""
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        target.rename(old)
    try:
        partial.rename(target)
    except OSError:
        if old.exists():
            old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def import_dataset(con: duckdb.DuckDBPyConnection, source: Path,
                   progress: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Replace the runs and estimates ``source`` holds in the store at ``con``; returns rows per table."""
    import duckdb

    schema = source / SCHEMA_FILE
    if not schema.is_file():
        raise TraceanaError(f"{source}: not a traceana Parquet dataset (no {SCHEMA_FILE})")
    statements = schema.read_text().replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    counts: dict[str, int] = {}
    try:
        with store.transaction(con, statements):  # this version's schema and views too, all or nothing
            for name, columns, _ in _tables(con):
                folder = source / name
                if not folder.is_dir():
                    continue
                key = next((k for k in KEYS if k in columns), None)
                reader = (f"read_parquet('{_sql_path(folder)}/**/*.parquet', hive_partitioning = true, "
                          "hive_types_autocast = false)")
                if key is not None:
                    con.execute(f'DELETE FROM "{name}" WHERE {key} IN (SELECT DISTINCT {key} FROM {reader})')
                con.execute(f'INSERT INTO "{name}" BY NAME SELECT * FROM {reader}')
                counts[name] = con.execute(f"SELECT count(*) FROM {reader}").fetchall()[0][0]
                progress(name)
    except duckdb.Error as exc:
        raise TraceanaError(f"{source}: cannot import ({str(exc).splitlines()[0]})") from None
    return counts
