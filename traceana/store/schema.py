"""What a store holds: the tables of schema.sql, the views of queries/*.sql, and the check that a database (a DuckDB
file or a Parquet dataset's schema) has this version's tables and columns."""

from __future__ import annotations

import functools
import re
from contextlib import suppress
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from traceana.errors import TraceanaError

if TYPE_CHECKING:  # imported where used, so that `traceana --help` loads no DuckDB
    import duckdb

# What a report says when a view it reads could not be defined on an older database (see traceana.store.connect).
OUTDATED = "this database was written by an older traceana and lacks columns this report reads: ingest the run again"
# Tables a store written before they existed lacks: it is still read (a reader treats the table as empty) and its
# next write creates them.
ADDED_TABLES = frozenset({"syncs", "event_ops", "event_scopes"})
FRESH = "ingest again into a new --db file"


def schema_sql() -> str:
    return resources.files("traceana.store").joinpath("schema.sql").read_text()


def view_sql() -> list[str]:
    """The CREATE VIEW statements of queries/*.sql, in file-name order (files are numbered by dependency)."""
    root = resources.files("traceana.queries")
    return [p.read_text() for p in sorted(root.iterdir(), key=lambda p: p.name) if p.name.endswith(".sql")]


@functools.cache
def _expected_columns() -> dict[str, list[tuple[str, str]]]:
    """Each store table's (column, type) list, as this version's schema.sql creates them."""
    import duckdb

    with duckdb.connect(":memory:") as con:
        con.execute(schema_sql())
        return _columns(con)


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[str, str]]]:
    rows = con.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                       "WHERE table_catalog = current_database() AND table_schema = 'main' "
                       "AND table_name IN (SELECT table_name FROM information_schema.tables "
                       "WHERE table_type = 'BASE TABLE') ORDER BY table_name, ordinal_position").fetchall()
    found: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        found.setdefault(table, []).append((column, kind))
    return found


@functools.cache
def _added_columns() -> set[tuple[str, str]]:
    """(table, column) that schema.sql adds to stores written before the column existed (ALTER TABLE ... ADD COLUMN
    IF NOT EXISTS): a store lacking only those is an older store of this schema, upgraded by its next write."""
    return set(re.findall(r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+)", schema_sql()))


def check_tables(con: duckdb.DuckDBPyConnection, path: Path, *, read_only: bool) -> None:
    """The table part of :func:`traceana.store.database.check_schema`, which a Parquet dataset's schema.sql passes
    too."""
    found = _columns(con)
    if not found:
        if read_only:
            raise TraceanaError(f"{path}: the database holds no runs yet (run `traceana ingest PATH` first)")
        return
    expected = _expected_columns()
    if "runs" not in found:
        raise TraceanaError(f"{path}: a DuckDB database but not a traceana store (its tables: "
                            f"{', '.join(sorted(found)[:5])}); pass --db with a traceana store or a new file name")
    added = _added_columns()
    for table, columns in expected.items():
        if table not in found and table in ADDED_TABLES:
            continue
        have = {c for c, _ in found.get(table, [])}
        if found.get(table) != [(c, t) for c, t in columns if c in have or (table, c) not in added]:
            lacking = [c for c, _ in columns if c not in have]
            problem = (f"no {table} table" if table not in found else f"{table} lacks {', '.join(lacking)}"
                       if lacking else f"{table} has other columns or types")
            raise TraceanaError(f"{path}: a store of another traceana schema ({problem}); {FRESH}")


def define_views(con: duckdb.DuckDBPyConnection) -> None:
    """This version's views, as temporary views that shadow any stored ones."""
    import duckdb

    for sql in view_sql():
        # an older store may lack a column a view reads: the reports that need that view raise OUTDATED
        with suppress(duckdb.BinderException, duckdb.CatalogException):
            con.execute(sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))
