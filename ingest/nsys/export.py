"""One Nsight Systems SQLite export, opened read-only (profiler_sqlite.ProfilerSqlite) and read by column name.

Exports differ between nsys versions (2022.x schema 2.9 ... 2026.x schema 3.28): metadata tables were renamed,
columns are inserted mid-table, lazy exports omit empty tables, and some strings are not valid UTF-8. This module
hides that: callers ask for a table and the columns they want, and get a Polars frame with exactly those columns
(NULL where the export lacks one) or None where the table is absent, with what was missing written to ``notes``.
It also turns a ``.nsys-rep`` into an SQLite export with the nsys CLI.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from contextlib import suppress
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.profiler_sqlite import ProfilerSqlite, unknown_id

SQLITE_MAGIC = b"SQLite format 3\x00"
TIMES = ("start", "end")  # read as they are: a time that is not an integer is an error; other ids may be unknown
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 2023+ name, 2022 name
RUNTIME_COLUMNS = {"start": pl.Int64(), "end": pl.Int64(), "globalTid": pl.Int64(), "correlationId": pl.Int64(),
                   "nameId": pl.Int64()}


def pid_of(gid: str) -> pl.Expr:
    """The process id in a globalPid / globalTid (layout hw:8 vm:8 pid:24 tid:24)."""
    return (pl.col(gid) // 16777216) & 16777215


def is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def _check_header(path: Path) -> None:
    """Refuse files that are not SQLite, or shorter than their header says (a truncated copy or download)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot read ({exc.strerror})") from None
    if not header.startswith(SQLITE_MAGIC):
        raise TraceanaError(f"{path}: not an SQLite database (expected an nsys export: nsys export --type sqlite)")
    if len(header) < 100:
        raise TraceanaError(f"{path}: truncated SQLite file ({len(header)} bytes)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if pages and header[24:28] == header[92:96]:  # the in-header size is valid only when these two agree
        expected, actual = page_size * pages, path.stat().st_size
        if actual < expected:
            raise TraceanaError(f"{path}: truncated SQLite file ({actual} bytes, its header says {expected})")


def _read(column: str, dtype: pl.DataType) -> str:
    """The SQL that reads ``column`` as ``dtype``: ids through unknown_id, text as text, times as they are."""
    quoted = f'"{column}"'
    if dtype.is_integer() and column not in TIMES:
        return f'{unknown_id(quoted)} AS "{column}"'
    if dtype == pl.String():
        return f'CAST({quoted} AS TEXT) AS "{column}"'
    return quoted


class Export(ProfilerSqlite):
    """A read-only view of one export: tables, columns, metadata, strings."""

    def __init__(self, path: Path) -> None:
        _check_header(path)
        super().__init__(path, "the export")
        try:
            self.meta = self._meta()
        except TraceanaError:  # not an export: probing many files must not leave them open
            self.close()
            raise
        self.open_arrow()

    def _meta(self) -> dict[str, str]:
        table = next((t for t in META_TABLES if t in self.tables), None)
        if table is None:
            if "StringIds" not in self.tables:
                raise TraceanaError(
                    f"{self.path}: an SQLite database but not an Nsight Systems export "
                    f"(no {' / '.join(META_TABLES)} or StringIds table)"
                )
            self.notes.append(f"{self.path.name}: no export metadata table; nsys version unknown")
            return {}
        return {str(k): str(v) for k, v in self.rows(f'SELECT name, value FROM "{table}"')}

    @property
    def version(self) -> str | None:
        product, schema = self.meta.get("EXPORT_PRODUCT_VERSION"), self.meta.get("EXPORT_SCHEMA_VERSION")
        if not product:
            return None
        return f"nsys {product} (export schema {schema})" if schema else f"nsys {product}"

    def frame(self, table: str, columns: dict[str, pl.DataType], required: tuple[str, ...] = (),
              narrow: str = "") -> pl.DataFrame | None:
        """``columns`` of ``table`` (NULL where the export lacks one), or None when the table is absent.

        A missing column in ``required`` is an error naming the table; other missing columns go into ``notes``.
        ``narrow`` is a WHERE clause that spares sqlite3 the Python objects of rows the caller will drop; the
        native reader reads every row faster than SQLite filters them, so the caller filters the frame itself.
        """
        if table not in self.tables:
            return None
        present = set(self.columns(table))
        missing = [c for c in columns if c not in present]
        if lacking := [c for c in required if c in missing]:
            raise TraceanaError(f"{self.path}: table {table} has no column {', '.join(lacking)} (not an nsys export?)")
        if missing:
            self.notes.append(f"{self.path.name}: {table} has no column {', '.join(missing)}")
        select = ", ".join(_read(c, t) if c in present else f'NULL AS "{c}"' for c, t in columns.items())
        stored, ids = self._stored(table, columns)
        return self.query(stored, columns, f"table {table}", ids=ids,
                          slow_sql=f'SELECT {select} FROM "{table}" {narrow}')

    def _stored(self, table: str, columns: dict[str, pl.DataType]) -> tuple[str, tuple[str, ...]]:
        """The query the Arrow reader runs for :meth:`frame` (ids as stored), and its id columns."""
        present = set(self.columns(table))
        ids = tuple(c for c, t in columns.items() if c in present and t.is_integer() and c not in TIMES)
        stored = ", ".join(f'"{c}"' if c in present else f'NULL AS "{c}"' for c in columns)
        return f'SELECT {stored} FROM "{table}"', ids

    def prefetch_table(self, table: str, columns: dict[str, pl.DataType]) -> None:
        """Start reading what :meth:`frame` of ``table`` and ``columns`` will ask for (ProfilerSqlite.prefetch); that
        call still checks the columns and says what the table lacks, in its place among the notes."""
        if table in self.tables:
            sql, ids = self._stored(table, columns)
            self.prefetch(sql, columns, ids)

    def strings(self) -> pl.DataFrame:
        """StringIds as (id, value): every name in the export is an id into it."""
        frame = self.frame("StringIds", {"id": pl.Int64(), "value": pl.String()}, required=("id", "value"))
        return frame if frame is not None else pl.DataFrame(schema={"id": pl.Int64(), "value": pl.String()})

    def runtime(self) -> pl.DataFrame | None:
        """CUPTI_ACTIVITY_KIND_RUNTIME as pid, tid, correlationId, nameId, start, end (None where the export has no
        such table): read once for both of its readers, the launch times of device work and the syncs, since after
        the kernels it is the export's largest table."""
        runtime = self.frame("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLUMNS)
        if runtime is None:
            return None
        return runtime.select(pid_of("globalTid").alias("pid"), (pl.col("globalTid") & 16777215).alias("tid"),
                              "correlationId", "nameId", "start", "end")

    def capture_env(self) -> dict[str, str]:
        """The launched process's environment as recorded in META_DATA_CAPTURE (3.x exports), else empty."""
        if "META_DATA_CAPTURE" not in self.tables:
            return {}
        env: dict[str, str] = {}
        rows = self.rows("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'")
        for (value,) in rows:
            key, _, text = str(value).partition("=")
            env.setdefault(key, text.strip('"'))
        return env


def export_report(report: Path, cache_dir: Path) -> Path:
    """The SQLite export of ``report`` (.nsys-rep), made with ``nsys export`` once and cached by content stamp."""
    exported = report.with_suffix(".sqlite")
    by_hand = f"nsys export --type sqlite --output {exported} {report}"
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceanaError(f"{report}: nsys is not on PATH to export it; run `{by_hand}` and ingest the .sqlite")
    stat = report.stat()
    stamp = hashlib.sha1(f"{report.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir / f"{report.stem}-{stamp}.sqlite"
    if target.exists():
        return target
    created = not cache_dir.exists()
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial.sqlite")
    command = [nsys, "export", "--type", "sqlite", "--quiet", "true", "--force-overwrite", "true",
               "--output", str(partial), str(report)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not partial.exists():
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        partial.unlink(missing_ok=True)
        if created:  # no empty cache folder left behind (one another export is writing in stays)
            with suppress(OSError):
                cache_dir.rmdir()
        raise TraceanaError(f"{report}: nsys export failed ({reason}); try `{by_hand}` by hand")
    partial.replace(target)
    return target
