"""Reading profiler SQLite exports (Nsight Systems, Ascend) into typed frames, whatever a column holds.

SQLite types values, not columns: an id column may hold the profilers' "none" (uint32 or uint64 -1, stored as
4294967295, as -1, or as a REAL 1.8e19 when it no longer fits an integer), text, or a float. An id that is not a
plain integer is read as unknown (NULL): that is data, not an error. A value that matters and cannot be represented
(a time, a rank) is a one-line error naming the file, the table or field and the value.

:class:`ProfilerSqlite` is one export opened read-only, which the nsys and Ascend readers build on. Queries are read
straight into Arrow by ADBC's SQLite driver (:class:`ArrowQueries`, native code, the optional
extra ``traceana[sqlite]``) where it is installed; Python's sqlite3 rows and :func:`typed_frame` read what it does
not (the driver absent, or a result it cannot type plainly), and give the same frame or the one-line error. A
reader may start a large query early on a thread of its own (:meth:`ProfilerSqlite.prefetch`): SQLite and the
driver hold no GIL, so on a second core it is read while the reader works on another table.
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pyarrow as pa

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


class ArrowQueries:
    """A second read-only connection to an SQLite file, through ADBC's SQLite driver: a query's result arrives as
    Arrow columns built in native code, 3-5x faster than sqlite3's Python rows (whose objects are the floor there).

    ``frame`` answers None where the driver is not installed or the result is not plainly of the wanted types: a
    value of another type partway down a column (the driver types a column by its first rows and then refuses),
    text that is not UTF-8, an integer too wide for its column. The caller then reads that query with sqlite3 and
    :func:`typed_frame`, which give the same frame, or the one-line error naming the bad value."""

    def __init__(self, uri: str) -> None:
        self._con = None
        try:
            import adbc_driver_manager
            import adbc_driver_sqlite
        except ImportError:
            return
        self._adbc = adbc_driver_manager
        try:
            self._db = adbc_driver_sqlite.connect(uri)
            self._con = adbc_driver_manager.AdbcConnection(self._db)
        except adbc_driver_manager.Error:
            return

    def frame(self, sql: str, schema: dict[str, pl.DataType], ids: tuple[str, ...] = ()) -> pl.DataFrame | None:
        """The result of ``sql`` as a frame of ``schema`` (by column name), or None where sqlite3 must read it.

        ``ids`` are 64-bit id columns that ``sql`` reads as they are stored rather than through :func:`unknown_id`
        (whose CASE costs SQLite as much as reading the column): their "none" values become NULL here, which is the
        same where the whole column is integers, and anything else is not read here."""
        if self._con is None:
            return None
        try:
            with self._adbc.AdbcStatement(self._con) as statement:
                statement.set_sql_query(sql)
                stream, _ = statement.execute_query()
                table = pa.RecordBatchReader._import_from_c(stream.address).read_all()
            for column in table.columns:
                if pa.types.is_string(column.type):
                    column.validate(full=True)  # the driver passes text through as it is stored
            frame = _cast(pl.from_arrow(table), schema)  # type: ignore[arg-type]
        except (self._adbc.Error, pa.ArrowException, OSError, pl.exceptions.PolarsError):
            return None
        if frame is None or not ids:
            return frame
        return frame.with_columns(pl.when(~pl.col(c).is_in(UNKNOWN_IDS)).then(pl.col(c)).alias(c) for c in ids)

    @property
    def available(self) -> bool:
        """Whether the driver is installed and opened the file."""
        return self._con is not None

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._db.close()
            self._con = None


def _cast(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
    """``frame`` in ``schema`` where each column holds what sqlite3 would have read into it without a question: NULLs
    only, or 64-bit integers for an integer or float column, text for a text one, reals for a float one."""
    columns = []
    for name, dtype in frame.schema.items():
        wanted = schema[name]
        plain = (frame[name].null_count() == frame.height or dtype == wanted
                 or (dtype == pl.Int64() and (wanted.is_integer() or wanted == pl.Float64())))
        if not plain:
            return None
        columns.append(pl.col(name).cast(wanted, strict=True))  # an Int32 column raises on a wider value
    return frame.select(columns)


class ProfilerSqlite:
    """One profiler SQLite export opened read-only twice: sqlite3, which reads any value and gives the one-line
    errors, and :class:`ArrowQueries`, which reads plain results fast. ``kind`` names the file in errors ("the
    export", "the database"); ``notes`` collects what a reader leaves out. Call :meth:`open_arrow` once the file is
    known to be of the reader's format (probing many files must not leave them open), and :meth:`close` after."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind
        self.notes: list[str] = []
        # A finished export has no pending write-ahead log: open it immutable, which writes no -shm file beside it
        # (the Ascend profiler leaves its databases in WAL mode, and input folders may be read-only).
        wal = path.with_name(path.name + "-wal")
        mode = "ro" if wal.is_file() and wal.stat().st_size else "ro&immutable=1"
        self._uri = f"file:{quote(str(path.resolve()))}?mode={mode}"
        self._arrow: ArrowQueries | None = None
        self._columns: dict[str, list[str]] = {}
        self._early: ThreadPoolExecutor | None = None  # one thread, with a connection of its own (_apart)
        self._apart: ArrowQueries | None = None
        self._prefetched: dict[str, Future[pl.DataFrame | None]] = {}
        con = None
        try:
            con = sqlite3.connect(self._uri, uri=True)
            con.text_factory = decode_text  # some profilers' strings are not UTF-8
            self.tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error as exc:
            if con is not None:
                con.close()
            raise TraceanaError(f"{path}: not a readable SQLite database ({exc})") from None
        self._con = con

    def open_arrow(self) -> None:
        self._arrow = ArrowQueries(self._uri)

    def close(self) -> None:
        if self._early is not None:  # no thread outlives the file (a query not yet started is dropped)
            self._early.shutdown(wait=True, cancel_futures=True)
        if self._apart is not None:
            self._apart.close()
        self._con.close()
        if self._arrow is not None:
            self._arrow.close()

    def prefetch(self, sql: str, schema: dict[str, pl.DataType], ids: tuple[str, ...] = ()) -> None:
        """Start reading ``sql`` through Arrow on this file's background thread, with a connection of its own, for
        the :meth:`query` of the same ``sql`` to take (prefetched queries run one after another, in order)."""
        if self._arrow is None or not self._arrow.available:
            return
        self._early = self._early or ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-prefetch")
        self._prefetched[sql] = self._early.submit(self._read_apart, sql, schema, ids)

    def _read_apart(self, sql: str, schema: dict[str, pl.DataType], ids: tuple[str, ...]) -> pl.DataFrame | None:
        """:meth:`ArrowQueries.frame` on the background thread's own connection (a connection is never used by two
        threads at once)."""
        self._apart = self._apart or ArrowQueries(self._uri)
        return self._apart.frame(sql, schema, ids)

    def _unreadable(self, what: str, exc: sqlite3.Error) -> TraceanaError:
        return TraceanaError(f"{self.path}: cannot read {what} ({exc}); is the file complete?")

    def rows(self, sql: str) -> list[tuple]:
        """The rows of ``sql``, or a one-line error naming the file."""
        try:
            return self._con.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise self._unreadable(self.kind, exc) from None

    def scalar(self, sql: str) -> object | None:
        """The first value of ``sql``, or None when it returns nothing or a table it names is absent."""
        try:
            rows = self._con.execute(sql).fetchall()
        except sqlite3.OperationalError:
            return None
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(self.kind, exc) from None
        return rows[0][0] if rows else None

    def columns(self, table: str) -> list[str]:
        """``table``'s columns in order (none for a table the file lacks)."""
        if table not in self._columns:
            self._columns[table] = [r[1] for r in self.rows(f'PRAGMA table_info("{table}")')] \
                if table in self.tables else []
        return self._columns[table]

    def has(self, table: str, columns: tuple[str, ...] = ()) -> bool:
        return table in self.tables and set(columns) <= set(self.columns(table))

    def query(self, sql: str, schema: dict[str, pl.DataType], where: str, *, ids: tuple[str, ...] = (),
              slow_sql: str | None = None) -> pl.DataFrame:
        """The result of ``sql`` typed by ``schema`` (looked up by the result's column names), through Arrow where it
        can be; else through sqlite3 (``slow_sql`` where the caller has a form better for it) and
        :func:`typed_frame`. ``where`` names the table in an error; ``ids`` as in :meth:`ArrowQueries.frame`."""
        early = self._prefetched.pop(sql, None)
        fast = early.result() if early is not None else \
            self._arrow.frame(sql, schema, ids) if self._arrow is not None else None
        if fast is not None:
            return fast
        try:
            cursor = self._con.execute(slow_sql or sql)
            rows = cursor.fetchall()
        except sqlite3.Error as exc:
            raise self._unreadable(where, exc) from None
        return typed_frame(rows, {c[0]: schema[c[0]] for c in cursor.description}, self.path, where)
