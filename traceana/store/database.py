"""A store as one DuckDB file: opening it (one line for a file that is locked, damaged, or not a store), the one
transaction a run is written in, and the run a command means.

What it guarantees: a write that fails leaves an existing store byte-for-byte as it was (schema, views and rows
change only inside the write's transaction) and leaves no file behind where there was none; a file that is not a
store of this schema is a one-line error for every command, before anything is read or written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from traceana.about import version
from traceana.errors import TraceanaError, first_line
from traceana.store.schema import FRESH, check_tables, define_views, schema_sql, view_sql

if TYPE_CHECKING:  # imported where used, so that `traceana --help` loads neither DuckDB nor Polars
    import duckdb

    from traceana.ingest.run_data import RunData

# No extension is installed or loaded behind the user's back (a SQLite file would otherwise pull in sqlite_scanner).
CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def check_schema(con: duckdb.DuckDBPyConnection, path: Path, *, read_only: bool) -> None:
    """A one-line error unless the database holds this version's tables with this version's columns (an older
    store may lack the columns schema.sql adds later), or is empty and about to be written. A file shorter than
    the blocks its header says are in use was cut short (a copy that stopped); other damage is found when a read
    reaches it (:func:`file_error`)."""
    size, blocks = con.execute("SELECT block_size, used_blocks FROM pragma_database_size() "
                               "WHERE database_name = current_database()").fetchall()[0]
    if path.stat().st_size < size * blocks:
        raise TraceanaError(f"{path}: the database file is truncated or damaged; restore it from a copy or {FRESH}")
    check_tables(con, path, read_only=read_only)


def _open_error(path: Path, exc: duckdb.Error, read_only: bool) -> TraceanaError:
    """The one line for a database that cannot be opened: locked (by whom), damaged, or not DuckDB at all."""
    import duckdb

    text = first_line(exc)
    if "lock" in text.lower():
        if read_only:
            return TraceanaError(f"{path}: another traceana process is writing this database; retry when it ends")
        try:  # readers share the file with each other, never with a writer: a read-only open tells who holds it
            duckdb.connect(str(path), read_only=True, config=CONFIG).close()
        except duckdb.Error:
            return TraceanaError(f"{path}: another traceana process is writing this database; retry when it ends")
        return TraceanaError(f"{path}: a reader (another traceana command) has this database open; "
                             "retry when it ends")
    if "not a valid DuckDB database" in text or "extension" in text.lower():
        return TraceanaError(f"{path}: not a DuckDB database; pass --db with a traceana store or a new file name")
    return file_error(path, exc) or TraceanaError(f"{path}: cannot open as a DuckDB database ({text})")


def file_error(path: Path, exc: duckdb.Error) -> TraceanaError | None:
    """The one line for a damaged file or a write the file system refused, or None for any other error."""
    text = str(exc)
    if "read enough bytes" in text or "checksum" in text.lower() or "corrupt" in text.lower():
        return TraceanaError(f"{path}: the database file is truncated or damaged; restore it from a copy or {FRESH}")
    if "No space left on device" in text:  # the write's transaction rolled back: its runs and rows are as they were
        return TraceanaError(f"{path}: no space left on device; the store's runs and rows are as they were")
    if "Permission denied" in text or "Read-only file system" in text:
        return TraceanaError(f"{path}: cannot write here ({first_line(exc)}); the store is unchanged")
    return None


@contextmanager
def connect(path: Path, *, read_only: bool, views: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the DuckDB file at ``path``. Read-only opens take no lock against each other; they define this
    version's views as temporary views, which shadow the stored ones, so reports always run the installed queries
    (a reader that only reads tables passes ``views=False`` and skips them: a quarter second for `traceana runs`).
    A writer changes nothing until :func:`transaction`; a file it created is removed again when the work fails."""
    import duckdb

    leftovers = [path, path.with_name(path.name + ".wal")]
    existed = {p for p in leftovers if p.exists()}
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=CONFIG)
    except duckdb.Error as exc:
        raise _open_error(path, exc, read_only) from None
    try:
        check_schema(con, path, read_only=read_only)
        if read_only and views:
            define_views(con)
        yield con
        con.close()
    except BaseException as exc:
        with suppress(duckdb.Error):
            con.close()
        _remove_new(leftovers, existed)
        if isinstance(exc, duckdb.Error) and (mapped := file_error(path, exc)):
            raise mapped from None
        raise


def _remove_new(paths: list[Path], existed: set[Path]) -> None:
    for p in paths:
        if p not in existed:
            p.unlink(missing_ok=True)


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection, *schema: str) -> Iterator[None]:
    """One transaction that also creates ``schema`` (and this version's views), so that nothing of a failed write,
    not even a table or a view, reaches the file."""
    import duckdb

    con.execute("BEGIN TRANSACTION")
    try:
        for sql in (schema_sql(), *schema, *view_sql()):
            con.execute(sql)
        yield
        con.execute("COMMIT")
    except BaseException:
        with suppress(duckdb.Error):  # a failed commit (disk full) may have ended the transaction already
            con.execute("ROLLBACK")
        raise


def write_run(con: duckdb.DuckDBPyConnection, run_id: str, data: RunData) -> None:
    """Replace run ``run_id`` with ``data`` in one transaction: all of it or none of it. Spilled tables stream from
    their Parquet parts (ranked and clock-shifted on the way in), never held in memory whole."""
    from traceana.ingest.run_data import SCHEMAS, SPILLED, TABLES, conform

    with transaction(con):
        for table in ("runs", *TABLES):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        con.execute(
            "INSERT INTO runs (run_id, source_format, sources, ingested_at, world_size, layout, tool_version, "
            "rank_source, notes, device, traceana_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, data.source_format, data.sources, dt.datetime.now(dt.UTC).replace(tzinfo=None),
             data.world_size, data.layout.spec if data.layout else None, data.tool_version, data.rank_source,
             data.notes, data.device, version()],
        )
        if data.spill is not None:
            con.register("spill_parts", data.spill.parts.to_arrow())
            with bounded_memory(con):
                for table in SPILLED:
                    if pattern := data.spill.glob(table):
                        con.execute(f"INSERT INTO {table} (run_id, {', '.join(SCHEMAS[table])}) SELECT ?, * FROM "
                                    f"({data.spill.select_sql(table, pattern)})", [run_id])
        for table in TABLES:
            if data.spill is not None and table in SPILLED:
                continue
            frame = conform(table, data.frames.get(table))
            if frame.is_empty():
                continue
            arrow = frame.to_arrow()  # noqa: F841  (DuckDB reads the local by name)
            columns = ", ".join(frame.columns)
            con.execute(f"INSERT INTO {table} (run_id, {columns}) SELECT ?, {columns} FROM arrow", [run_id])


@contextmanager
def bounded_memory(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB's buffer pool capped at 256 MiB per thread (512 MiB at least) while a spilled run streams in, or a
    dataset's partitions are written: by default it may keep up to 80 % of RAM of written blocks cached (or buffer
    every open partition), and a large run would take that much."""
    (limit, threads), = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchall()
    import duckdb

    con.execute(f"SET memory_limit = '{max(512, 256 * int(threads))}MiB'")
    restore = f"SET memory_limit = '{limit}'"
    try:
        yield
    except BaseException:
        with suppress(duckdb.TransactionException):  # an aborted transaction (disk full) refuses any SET until
            con.execute(restore)  # its ROLLBACK; the error that aborted it is the one to report
        raise
    con.execute(restore)


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


def open_run(con: duckdb.DuckDBPyConnection, run: str | None) -> str:
    """The run a command means (:func:`resolve_run`), the connection then showing that run only
    (:func:`restrict_to_run`): every view computes over its rows alone, whatever else the store holds. A view's
    ``WHERE run_id = ?`` does not reach its tables through every join and aggregate: toy8's comm matrix took 10.5 s
    in a store beside a 1,024-rank run, and 0.04 s shown alone.
    The run's step windows are computed once (:func:`materialize`): most views join them, and from a table the
    planner knows their number. Computed in each view, their default-window branch (an aggregate of the events) is
    estimated at a fifth of the events, and window_events hashes the events instead of the windows: at 1,024 ranks,
    DuckDB capped at 256 MiB, a count of window_events peaked at 504 MiB in 3.8 s, 184 MiB in 2.1 s from the table."""
    run_id = resolve_run(con, run)
    restrict_to_run(con, run_id)
    materialize(con, "step_windows", run_id)
    return run_id


def show_every_run(con: duckdb.DuckDBPyConnection) -> None:
    """Undo :func:`restrict_to_run` and every :func:`materialize`: the tables show every run again, and the views
    compute over them (a session's connection moving to another run: the rows kept were the last run's)."""
    from traceana.ingest.run_data import TABLES

    for table in ("runs", *TABLES):
        con.execute(f"DROP VIEW IF EXISTS temp.main.{table}")
    for view in _materialized(con):
        forget(con, view)


def restrict_to_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Make every table, and so every view built on them, show run ``run_id`` only: temporary views named like the
    tables shadow them for this connection, so ad-hoc SQL cannot average over several runs by accident."""
    from traceana.ingest.run_data import TABLES

    catalog = con.execute("SELECT current_database()").fetchall()[0][0]
    literal = run_id.replace("'", "''")
    for table in ("runs", *TABLES):
        con.execute(f'CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM "{catalog}".main.{table} '
                    f"WHERE run_id = '{literal}'")


def materialize(con: duckdb.DuckDBPyConnection, view: str, run_id: str) -> None:
    """Compute view ``view`` once for run ``run_id`` on this connection: its rows go to a temporary table, and a
    temporary view of the same name over that table shadows the installed one (kept aside under another name), so
    the queries after it (and every view built on it) read the rows instead of computing them again. For a command
    that reads one costly view several ways (`comm`: collective_bandwidth four times). Rows computed before are
    computed again."""
    if view in _materialized(con):
        forget(con, view)
    con.execute(f"CREATE TEMP TABLE _{view}_rows AS SELECT * FROM {view} WHERE run_id = ?", [run_id])
    if _temporary_view(con, view):
        con.execute(f"ALTER VIEW temp.main.{view} RENAME TO _{view}_installed")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM _{view}_rows")


def forget(con: duckdb.DuckDBPyConnection, view: str) -> None:
    """Undo :func:`materialize`: drop the rows (DuckDB memory the rest of the command may need) and show the
    installed view again. (Renamed back, not defined again: a view is bound as it is defined, which over a
    dataset's files globs every table it reads: 11 s of advise over 1,024 ranks.)"""
    con.execute(f"DROP VIEW IF EXISTS temp.main.{view}")
    con.execute(f"DROP TABLE IF EXISTS temp.main._{view}_rows")
    if _temporary_view(con, f"_{view}_installed"):
        con.execute(f"ALTER VIEW temp.main._{view}_installed RENAME TO {view}")


def _temporary_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = ?",
                            [name]).fetchall()[0][0])


def _materialized(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The views :func:`materialize` holds the rows of on this connection."""
    return [name[1:-len("_rows")] for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, '_') "
        "AND ends_with(table_name, '_rows')").fetchall()]
