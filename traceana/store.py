"""The DuckDB store: schema on first use, one transaction per run, and the views from queries/*.sql."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from traceana.errors import TraceanaError

if TYPE_CHECKING:  # imported where used, so that `traceana --help` loads neither DuckDB nor Polars
    import duckdb

    from traceana.ingest.run_data import RunData

DEFAULT_DB = "traceana.duckdb"
# What a report says when a view it reads could not be defined on an older database (see connect).
OUTDATED = "this database was written by an older traceana and lacks columns this report reads: ingest the run again"


def _schema_sql() -> str:
    return resources.files("traceana").joinpath("schema.sql").read_text()


def view_sql() -> list[str]:
    """The CREATE VIEW statements of queries/*.sql, in file-name order (files are numbered by dependency)."""
    root = resources.files("traceana.queries")
    return [p.read_text() for p in sorted(root.iterdir(), key=lambda p: p.name) if p.name.endswith(".sql")]


@contextmanager
def connect(db: str | Path = DEFAULT_DB, *, read_only: bool = False,
            views: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the store. A writer creates schema and views on first use. Read-only opens need the file and take no
    lock against each other; they define this version's views as temporary views, which shadow the stored ones,
    so reports always run the installed queries even on a database an older traceana wrote. A reader that only
    reads tables passes ``views=False`` and skips defining them (a quarter second: `traceana runs`)."""
    import duckdb

    path = Path(db)
    if read_only and not path.exists():
        raise TraceanaError(f"{path}: no such database (run `traceana ingest` first, or pass --db)")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            message = "another traceana process is writing this database; retry when it ends"
            raise TraceanaError(f"{path}: {message}") from None
        raise TraceanaError(f"{path}: cannot open as a DuckDB database ({str(exc).splitlines()[0]})") from None
    try:
        if not read_only:
            con.execute(_schema_sql())
        for sql in view_sql() if views or not read_only else []:
            try:
                con.execute(sql.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1) if read_only
                            else sql)
            except duckdb.BinderException:
                if not read_only:
                    raise
                # a read-only database older than a column this view reads: the reports that need it raise OUTDATED
        yield con
    finally:
        con.close()


def write_run(con: duckdb.DuckDBPyConnection, run_id: str, data: RunData) -> None:
    """Replace run ``run_id`` with ``data`` in one transaction: all of it or none of it."""
    from traceana.ingest.run_data import TABLES, conform

    con.execute("BEGIN TRANSACTION")
    try:
        for table in ("runs", *TABLES):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        con.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, data.source_format, data.sources, dt.datetime.now(dt.UTC).replace(tzinfo=None),
             data.world_size, data.layout.spec if data.layout else None, data.tool_version, data.rank_source,
             data.notes],
        )
        for table in TABLES:
            frame = conform(table, data.frames.get(table))
            if frame.is_empty():
                continue
            arrow = frame.to_arrow()  # noqa: F841  (DuckDB reads the local by name)
            columns = ", ".join(frame.columns)
            con.execute(f"INSERT INTO {table} (run_id, {columns}) SELECT ?, {columns} FROM arrow", [run_id])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def resolve_run(con: duckdb.DuckDBPyConnection, run: str | None) -> str:
    """The run a command means: the one named, or the only/latest one when none is named."""
    if run is not None:
        if not con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run]).fetchall():
            known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
            raise TraceanaError(f"unknown run {run!r} (known: {', '.join(known) or 'none'})")
        return run
    rows = con.execute("SELECT run_id FROM runs ORDER BY ingested_at DESC LIMIT 1").fetchall()
    if not rows:
        raise TraceanaError("the database holds no runs yet (run `traceana ingest PATH` first)")
    return str(rows[0][0])


def restrict_to_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Make every table, and so every view built on them, show run ``run_id`` only: temporary views named like the
    tables shadow them for this connection, so ad-hoc SQL cannot average over several runs by accident."""
    from traceana.ingest.run_data import TABLES

    catalog = con.execute("SELECT current_database()").fetchall()[0][0]
    literal = run_id.replace("'", "''")
    for table in ("runs", *TABLES):
        con.execute(f'CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM "{catalog}".main.{table} '
                    f"WHERE run_id = '{literal}'")
