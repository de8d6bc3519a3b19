"""A store as a Parquet dataset and back: one folder per table, Hive-partitioned by run (and rank), so Spark, DuckDB
or Polars read any table, or one run's or rank's part of it, without the .duckdb file.

Layout: ``DIR/schema.sql`` (the store's CREATE TABLE statements), ``DIR/{table}/run_id={id}/rank={r}/*.parquet`` for
tables with a rank column, ``DIR/{table}/run_id={id}/*.parquet`` for the other run tables, and the same by
``estimate_id`` for the estimator's tables. Partition columns live in the paths only (as Spark expects), so a
reader restores their types from schema.sql. Export writes a hidden sibling folder and renames it into place;
import replaces the runs and estimates the dataset holds in one transaction: either path is all or nothing.

Such a dataset is also a store in its own right (``--db DIR``, :func:`connect`): every command reads it through
DuckDB views over its files, and `traceana ingest` (or any writer) adds to it with the same all-or-nothing rename.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from traceana.errors import TraceanaError, first_line
from traceana.store import database
from traceana.store.schema import check_tables, define_views

if TYPE_CHECKING:
    import duckdb

KEYS = ("run_id", "estimate_id")  # what a table's rows belong to; export partitions by it, import replaces by it
SCHEMA_FILE = "schema.sql"
# ROWS/{key}/{key}={id}/*.parquet: (table, rank, rows) of each run or estimate as written, which a reader checks the
# files against (a partition or table folder gone, a file replaced). The leading _ keeps Spark from taking it for a
# table; a dataset written before it has none, and its runs are read unchecked.
ROWS = "_rows"


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
    if target.exists() and not (is_marked(target) or (target.is_dir() and not any(target.iterdir()))):
        raise TraceanaError(f"{target}: not a traceana Parquet dataset (no {SCHEMA_FILE} declaring its runs table); "
                            "--replace replaces only a dataset, never a file or another folder: pick a new name")
    with writer_lock(target):
        partial = _partial(target)
        partial.mkdir(parents=True)
        try:
            counts = _write(con, partial, progress)
            _move_into_place(partial, target)
        except BaseException:
            _remove(partial)
            raise
    return counts


def is_marked(folder: Path) -> bool:
    """Whether ``folder`` is a traceana dataset, by its marker: a schema.sql that declares the store's runs table
    (as every export writes it), not only a file of that name."""
    schema = folder / SCHEMA_FILE
    try:
        return folder.is_dir() and schema.is_file() and re.search(r'CREATE TABLE "?runs"?\s*\(',
                                                                   schema.read_text(errors="replace")) is not None
    except OSError:
        return False


def _partial(target: Path) -> Path:
    """The hidden sibling a new version of ``target`` is written in (same file system: renamed into place)."""
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    _remove(partial)
    return partial


def _remove(folder: Path) -> None:
    """Remove a folder this process wrote, read-only folders in it too: copytree gives the copy of a read-only
    dataset the same modes, and rmtree alone would leave it behind."""
    for parent, _, _ in os.walk(folder):
        with suppress(OSError):
            os.chmod(parent, 0o700)
    shutil.rmtree(folder, ignore_errors=True)


def _write(con: duckdb.DuckDBPyConnection, folder: Path,
           progress: Callable[[str], None] = lambda _: None) -> dict[str, int]:
    """Every table of the store at ``con`` into ``folder`` (with schema.sql), as new files beside any already
    there: partitions by key and rank, or one file for a table without a key (replacing that table's folder)."""
    tables = _tables(con)
    (folder / SCHEMA_FILE).write_text("".join(f"{sql};\n" for _, _, sql in tables))
    counts: dict[str, int] = {}
    for name, columns, _ in tables:
        counts[name] = con.execute(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
        by = [c for c in (*KEYS, "rank") if c in columns]
        if counts[name] and by:  # an empty table is its folder-less absence; schema.sql still declares it
            con.execute(f"""COPY "{name}" TO '{_sql_path(folder / name)}'
                            (FORMAT parquet, PARTITION_BY ({", ".join(by)}), APPEND)""")
        elif counts[name]:
            shutil.rmtree(folder / name, ignore_errors=True)
            (folder / name).mkdir()
            con.execute(f"""COPY "{name}" TO '{_sql_path(folder / name / "data.parquet")}' (FORMAT parquet)""")
        progress(name)
    for key in KEYS:  # the rows written, per run (estimate), table and rank: ROWS
        counted = [f"""SELECT '{name}' AS "table", {key}, {"rank" if "rank" in columns else "NULL"}::INTEGER AS rank,
                       count(*) AS rows FROM "{name}" GROUP BY ALL""" for name, columns, _ in tables if key in columns]
        if counted:
            (folder / ROWS).mkdir(exist_ok=True)
            con.execute(f"""COPY ({" UNION ALL ".join(counted)}) TO '{_sql_path(folder / ROWS / key)}'
                            (FORMAT parquet, PARTITION_BY ({key}), APPEND)""")
    return counts


def _move_into_place(partial: Path, target: Path) -> None:
    """Rename ``partial`` to ``target``. An existing ``target`` is swapped with it in one step where the system can
    (readers, and a kill at any moment, see the old folder or the new one, never none) and removed after; elsewhere
    it is set aside first."""
    if target.exists() and _exchange(partial, target):
        _remove(partial)
        return
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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where the system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def reader(folder: Path) -> str:
    """read_parquet over one table's folder: partition columns from the paths, as text (schema.sql gives their
    types), and files written by different versions (one lacking a column added later) unified by column name."""
    return (f"read_parquet('{_sql_path(folder)}/**/*.parquet', hive_partitioning = true, "
            "hive_types_autocast = false, union_by_name = true)")


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
        with database.transaction(con, statements):  # this version's schema and views too, all or nothing
            for name, columns, _ in _tables(con):
                folder = source / name
                if not folder.is_dir():
                    continue
                key = next((k for k in KEYS if k in columns), None)
                files = reader(folder)
                if key is not None:
                    con.execute(f'DELETE FROM "{name}" WHERE {key} IN (SELECT DISTINCT {key} FROM {files})')
                con.execute(f'INSERT INTO "{name}" BY NAME SELECT * FROM {files}')
                counts[name] = con.execute(f"SELECT count(*) FROM {files}").fetchall()[0][0]
                progress(name)
    except duckdb.Error as exc:
        raise TraceanaError(f"{source}: cannot import ({first_line(exc)})") from None
    return counts


def is_dataset(path: Path) -> bool:
    """Whether ``--db`` names a Parquet dataset rather than a DuckDB file: a folder, or a name ending in .parquet."""
    return path.is_dir() or path.suffix == ".parquet"


@contextmanager
def writer_lock(folder: Path) -> Iterator[None]:
    """Hold the dataset's one writer lock (an flock on ``.NAME.lock`` beside it: the folder itself is swapped by
    each write) for a write, or a one-line error when another process holds it: two writers would each merge into
    the dataset as they found it, and the later rename would drop the earlier run. The lock file is removed after;
    one a killed writer left is taken over (the kernel released its lock)."""
    import fcntl

    lock = folder.parent / f".{folder.name}.lock"
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # under a file, in a read-only folder or /proc
            raise TraceanaError(f"{folder}: cannot write the dataset here ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TraceanaError(f"{folder}: another traceana process is writing this dataset; "
                                "retry when it ends") from None
        with suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:  # not a file the previous holder removed meanwhile
                break
        os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def check_writable(folder: Path) -> None:
    """A one-line error for a dataset this user may not change (its folder read-only), before a writer reads its
    inputs: the write would only fail at its end."""
    if folder.is_dir() and not (os.access(folder, os.W_OK | os.X_OK) and os.access(folder.parent, os.W_OK)):
        raise TraceanaError(f"{folder}: the dataset is read-only for this user; it is unchanged")


@contextmanager
def connect(folder: Path, *, read_only: bool, views: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """The dataset at ``folder`` as a store (a writer holding :func:`writer_lock` throughout)."""
    with nullcontext() if read_only else writer_lock(folder), _connect(folder, read_only=read_only,
                                                                         views=views) as con:
        yield con


# DuckDB's memory for a reader of a dataset (the out-of-core store): a breakdown of 1,024 synthesized ranks (16M
# events) took 1.7 GiB with DuckDB's default (80% of RAM), 0.9 GiB at 600 MB, in the same 23.5 s. Since step
# windows are computed once (store.open_run), 640 MiB against 1 GiB costs no time: at 1,024 ranks breakdown 861 /
# 1,203 MiB (9.5 / 9.1 s), kernels, idle, ops 0.92-0.95 / 1.32-1.35 GiB (and ops ran out of memory at 1 GiB); at
# 4,096 breakdown 1,151 / 1,543 MiB, stragglers 1,388 / 1,774, critical-path 1,494 / 2,437 (31 / 45 s).
READ_MEMORY = "640MiB"


@contextmanager
def _connect(folder: Path, *, read_only: bool, views: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """The dataset at ``folder`` as a store. A reader gets an in-memory DuckDB whose tables are views over the
    dataset's files (columns in schema.sql's order and types; a table without files stays an empty table) with the
    usual views on top. A writer gets an in-memory store holding the dataset's tables, empty: what it writes is
    added to the dataset when its work succeeds (:func:`merge`), and nothing is written when it fails. The writer's
    DuckDB offloads to a hidden buffer folder beside the dataset (removed after), so a large run written under
    database.write_run's capped memory limit waits on disk, not in memory; a reader's, past READ_MEMORY, in a private
    temporary folder (removed after)."""
    import duckdb

    schema = folder / SCHEMA_FILE
    if folder.exists() and not folder.is_dir():
        raise TraceanaError(f"{folder}: a file; a Parquet dataset is a folder (pass --db with a folder or a .duckdb)")
    if not schema.is_file() and (read_only or (folder.exists() and any(folder.iterdir()))):
        raise TraceanaError(f"{folder}: a folder but not a traceana Parquet dataset (no {SCHEMA_FILE}); pass --db "
                            "with a dataset, a store file, or a new or empty folder to ingest into")
    con = duckdb.connect(":memory:", config=database.CONFIG)
    spill = None
    try:
        if read_only:  # a reader's joins and sorts over thousands of ranks spill to a private folder, not grow
            spill = Path(tempfile.mkdtemp(prefix="traceana-read-"))
            con.execute(f"SET memory_limit = '{READ_MEMORY}'")
            # the files' bytes come from the OS's page cache: DuckDB's own copy of them stayed in the process
            # beside what the command holds (replay of 1,024 copies of a real rank: 0.6 GiB after the graph's read)
            con.execute("SET enable_external_file_cache = false")
        else:  # the run's rows wait here, not in memory, beyond DuckDB's memory limit
            folder.parent.mkdir(parents=True, exist_ok=True)
            spill = Path(tempfile.mkdtemp(prefix=f".{folder.name}.buffer-{os.getpid()}-", dir=folder.parent))
        con.execute("SET temp_directory = ?", [str(spill)])
        if schema.is_file():
            try:
                con.execute(schema.read_text())
            except duckdb.Error as exc:
                raise TraceanaError(f"{schema}: not a traceana schema ({first_line(exc)})") from None
            check_tables(con, folder, read_only=read_only)
        if read_only:
            _check_files(con, folder)
            if views:  # bound against the empty tables: over the files, every view would glob every table it reads
                define_views(con)
            _view_files(con, folder)
        yield con
        if not read_only:
            merge(con, folder)
    except duckdb.Error as exc:
        if mapped := database.file_error(folder, exc):  # a full disk, a folder that cannot be written
            raise mapped from None
        if isinstance(exc, duckdb.IOException | duckdb.InvalidInputException | duckdb.ConversionException):
            # a damaged or vanished Parquet file, a column or partition value of another type
            raise TraceanaError(f"{folder}: cannot read the dataset ({first_line(exc)})") from None
        raise
    finally:
        con.close()
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)


def _check_files(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """A one-line error for a damaged dataset, which would otherwise read as a run with ranks idle or rows gone:
    a table's files holding other row counts per run and rank than were written (ROWS: a partition, a file or a
    table folder missing), or a NULL where the schema says NOT NULL. Only the files' footers are read."""
    for name, _, _ in _tables(con):
        required = [r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
                                              "AND NOT is_nullable", [name]).fetchall()]
        if (folder / name).is_dir() and required:
            nulls = con.execute(f"""SELECT file_name, path_in_schema FROM parquet_metadata(
                                    '{_sql_path(folder / name)}/**/*.parquet') WHERE stats_null_count > 0
                                    AND path_in_schema IN ({", ".join("?" * len(required))}) LIMIT 1""",
                                required).fetchall()
            if nulls:
                raise TraceanaError(f"{nulls[0][0]}: NULL {nulls[0][1]} values, which no {name} row may have "
                                    "(a damaged or foreign file); restore the dataset or ingest the run again")
    for key in KEYS:
        if (folder / ROWS / key).is_dir():
            _check_counts(con, folder, key)


def _check_counts(con: duckdb.DuckDBPyConnection, folder: Path, key: str) -> None:
    written = {(t, i, r): n for t, i, r, n in con.execute(
        f"""SELECT "table", {key}, rank, rows FROM read_parquet('{_sql_path(folder / ROWS / key)}/**/*.parquet',
            hive_partitioning = true, hive_types_autocast = false)""").fetchall()}
    ids = {i for _, i, _ in written}
    found: dict[tuple[str, str, int | None], int] = {}
    for name in {t for t, _, _ in written}:
        if not (folder / name).is_dir():
            continue
        for file, rows in con.execute(f"SELECT file_name, num_rows FROM parquet_file_metadata("
                                      f"'{_sql_path(folder / name)}/**/*.parquet')").fetchall():
            parts = dict(part.split("=", 1) for part in Path(file).relative_to(folder / name).parts if "=" in part)
            rank = parts.get("rank")
            where = (name, unquote(parts.get(key, "")), int(rank) if rank and rank.isdigit() else None)
            if where[1] in ids:
                found[where] = found.get(where, 0) + rows
    for where in sorted(written.keys() | found.keys(), key=repr):
        if written.get(where, 0) != found.get(where, 0):
            name, ident, rank = where
            what = f"{name} of {key.split('_')[0]} {ident}" + (f" rank {rank}" if rank is not None else "")
            raise TraceanaError(f"{folder}: damaged dataset: {what} has {found.get(where, 0)} rows in its files, the "
                                f"write left {written.get(where, 0)} (a partition or file missing or replaced); "
                                "restore it or ingest the run again")


def _quoted(column: str) -> str:
    return f'"{column}"'


def _view_files(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """Replace each table that has files by a view over them, cast to the table's columns (NULL for a column no
    file has: the dataset predates it)."""
    for name, _, _ in _tables(con):
        if not (folder / name).is_dir():
            continue
        files = reader(folder / name)
        present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {files}").fetchall()}
        columns = con.execute(f'SELECT column_name, column_type FROM (DESCRIBE "{name}")').fetchall()
        select = ", ".join(f'CAST({_quoted(c) if c in present else "NULL"} AS {kind}) AS {_quoted(c)}'
                           for c, kind in columns)
        con.execute(f'DROP TABLE "{name}"')
        con.execute(f'CREATE VIEW "{name}" AS SELECT {select} FROM {files}')


def merge(con: duckdb.DuckDBPyConnection, folder: Path) -> None:
    """Add the runs and estimates of the in-memory store at ``con`` to the dataset at ``folder``, replacing those
    with the same ids, all or nothing: a hidden sibling gets hard links to the dataset's other files and ``con``'s
    rows as new partitions, then takes the dataset's place (:func:`_move_into_place`)."""
    replaced: dict[str, set[str]] = {}
    with database.bounded_memory(con):  # these scans would otherwise cache the whole run's blocks in memory
        for name, columns, _ in _tables(con):
            for key in (k for k in KEYS if k in columns):
                replaced.setdefault(key, set()).update(
                    r[0] for r in con.execute(f'SELECT DISTINCT {key} FROM "{name}"').fetchall())

    def left_out(_: str, names: list[str]) -> set[str]:
        """The dataset's schema.sql (written anew) and the partitions of the ids ``con`` replaces."""
        ids = {n for n in names if "=" in n and unquote(n.split("=", 1)[1]) in replaced.get(n.split("=", 1)[0], ())}
        return ({SCHEMA_FILE} & set(names)) | ids

    partial = _partial(folder)
    try:
        if folder.is_dir():
            shutil.copytree(folder, partial, copy_function=_link, ignore=left_out)
            for table in partial.iterdir():  # a table whose only run was replaced: absent, as export leaves it
                if table.is_dir() and not any(table.iterdir()):
                    table.rmdir()
        else:
            partial.mkdir(parents=True)
        with database.bounded_memory(con):  # a partitioned COPY would otherwise buffer the whole run
            _write(con, partial)
        _move_into_place(partial, folder)
    except BaseException as exc:
        _remove(partial)
        if isinstance(exc, OSError):  # no space for the new files, a folder it may not write in
            reason = exc.args[0][0][2] if isinstance(exc, shutil.Error) else exc.strerror or exc  # copytree's list
            raise TraceanaError(f"{folder}: cannot write the dataset ({reason}); it is unchanged") from None
        raise


def _link(source: str, target: str) -> None:
    """A kept file in the new version of a dataset: a hard link (no copy), or a copy where links are refused."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
