"""The one door user SQL comes through (CLI `sql`, API `Traces.sql`, the MCP server's `sql` tool): it reads the
store and nothing else, and writes nothing anywhere.

Two layers, each closing what the other leaves open (research/mcp-and-sql-guard.md §4, observed under duckdb 2.0.1):

- the statement: exactly one SELECT (also WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE), checked by DuckDB's own
  parser before anything runs, so COPY, EXPORT, ATTACH, INSTALL/LOAD, SET, PRAGMA, CALL and EXPLAIN (EXPLAIN ANALYZE
  runs its statement) never execute. A Parquet dataset's folder is readable to its views, so without this check a
  `COPY ... TO '<dataset>/x.parquet'` would write into it;
- the engine: ``enable_external_access = false`` with only the store's own files allowed (a `.duckdb` file: the
  file, its WAL and temp files, which DuckDB allows itself; a dataset: its folder, symlinks out of it refused), then
  ``lock_configuration`` so no statement can turn it back on or point logging at a file. So a SELECT that reads a
  file (``read_csv('/etc/passwd')``, ``glob``, ``read_text``) is refused too.

The engine settings belong to the database instance: connections in one process to one `.duckdb` file share it,
so a held session (`Traces.session`) to that file stays confined until every connection to it closes. It reads
on; only DuckDB settings and file access are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traceana.errors import TraceanaError, first_line

if TYPE_CHECKING:
    import duckdb
    import polars as pl

ALLOWED = "one SELECT statement (also WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE)"


def check_select(query: str) -> None:
    """A one-line error unless ``query`` is exactly one read-only statement, by DuckDB's parser (nothing runs)."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise TraceanaError(f"sql: {first_line(exc)}") from None
    if not statements:
        raise TraceanaError("sql: the query is empty")
    kinds = [s.type.name for s in statements]
    if kinds != ["SELECT"]:
        raise TraceanaError(f"sql runs {ALLOWED} and never writes a file or changes the store; got "
                            f"{' + '.join(kinds)}")


def confine(con: duckdb.DuckDBPyConnection, db: Path) -> None:
    """Let the database at ``con`` (the store ``db``, opened read-only) read only the store's own files from now on,
    for good. A dataset's reader already spills into a private temp folder of its own (dataset._connect), not the
    ``./.tmp`` DuckDB would otherwise allow. A `.duckdb` instance confined by an earlier query (another connection
    to the file is still open) stays as it is."""
    from traceana.store.dataset import is_dataset

    (access, locked), = con.execute("SELECT current_setting('enable_external_access'), "
                                    "current_setting('lock_configuration')").fetchall()
    if locked and not access:
        return
    if is_dataset(db):
        con.execute("SET allowed_directories = ?", [[str(db.resolve())]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def select(con: duckdb.DuckDBPyConnection, db: Path, query: str, *, limit: int | None = None) -> pl.DataFrame:
    """``query`` over the store ``db`` open at ``con``, checked (:func:`check_select`) and confined
    (:func:`confine`), as a frame of at most ``limit`` rows. Call it after the store's views (and a run's temporary
    views) exist: they read on under the lock."""
    import duckdb

    check_select(query)
    confine(con, db)
    try:
        relation = con.sql(query)
        if limit is not None:
            relation = relation.limit(limit)
        return relation.pl()
    except duckdb.PermissionException as exc:
        raise TraceanaError(f"sql reads the store's own files only: {first_line(exc)}") from None
    except duckdb.Error as exc:
        raise TraceanaError(f"query failed: {first_line(exc)}") from None
