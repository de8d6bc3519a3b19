"""The native SQLite reader (ADBC, profiler_sqlite.ArrowQueries) against the sqlite3 rows it stands in for.

Every table of the shared nsys and Ascend database exports must come out the same through either reader, and the
native one must hand back (None) every result it cannot type the way sqlite3 + typed_frame would: those are what
the one-line errors and the UTF-8 replacement are made from. The expected values are those written into the file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TRACES
from traceana.ingest.ascend.database import read_database
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.profiler_sqlite import ArrowQueries, unknown_id
from traceana.ingest.rules import load_rules

pytest.importorskip("adbc_driver_sqlite", reason="the optional native reader (pip install -e '.[sqlite]')")

SCHEMA = {"t": pl.Int64(), "id": pl.Int64(), "plane": pl.Int32(), "name": pl.String(), "bw": pl.Float64()}
SELECT = f"SELECT t, {unknown_id('id')} AS id, {unknown_id('plane', 32)} AS plane, name, bw FROM x"


def _database(path: Path, rows: list[tuple], *statements: str) -> ArrowQueries:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE x (t INTEGER, id INTEGER, plane INTEGER, name TEXT, bw REAL)")
        con.executemany("INSERT INTO x VALUES (?, ?, ?, ?, ?)", rows)
        for sql in statements:
            con.execute(sql)
    con.close()
    return ArrowQueries(f"file:{path}?mode=ro&immutable=1")


def _rows(n: int) -> list[tuple]:
    """n plain rows, more than one batch of the driver (it types a column by its first 1,024 rows)."""
    return [(1_000_000_000_000 + i, i, i % 8, f"kernel {i}", i / 4) for i in range(n)]


def test_sentinels_nulls_and_types_read_natively(tmp_path: Path) -> None:
    rows = _rows(3000)
    rows[0] = (rows[0][0], None, None, None, None)                   # NULLs first: the column's type is still known
    rows[1] = (rows[1][0], 4294967295, 4294967295, "k", 2)           # uint32 -1 as SQLite stores it; an int in REAL
    rows[2] = (rows[2][0], -1, -1, "k", 0.5)                         # uint64 -1 written signed
    rows[2500] = (rows[2500][0], None, 2**40, "k", 1.0)  # a plane past 32 bits
    # 2^64-1 as a literal, which SQLite stores as a REAL (past int64)
    reader = _database(tmp_path / "x.sqlite", rows, "UPDATE x SET id = 18446744073709551615 WHERE rowid = 2501")
    frame = reader.frame(SELECT, SCHEMA)
    reader.close()
    assert frame is not None and frame.schema == pl.Schema(SCHEMA)
    assert frame.height == 3000 and frame["t"].to_list() == [r[0] for r in rows]
    assert frame.row(0) == (rows[0][0], None, None, None, None)
    assert frame.row(1) == (rows[1][0], None, None, "k", 2.0)
    assert frame.row(2) == (rows[2][0], None, None, "k", 0.5)
    assert frame.row(2500) == (rows[2500][0], None, None, "k", 1.0)  # unknown_id: past int64, and past 32 bits
    assert frame.row(2999) == (rows[2999][0], 2999, 2999 % 8, "kernel 2999", 2999 / 4)


def test_ids_read_as_stored_lose_their_sentinels_as_unknown_id_does(tmp_path: Path) -> None:
    rows = _rows(3000)
    rows[1], rows[2] = (1, 4294967295, 0, "k", 1.0), (2, -1, 0, "k", 1.0)
    reader = _database(tmp_path / "x.sqlite", rows)
    stored = "SELECT t, id, plane, name, bw FROM x"
    frame = reader.frame(stored, SCHEMA, ids=("id",))
    assert frame is not None and frame["id"].to_list()[:4] == [0, None, None, 3]
    assert_frame_equal(frame, reader.frame(SELECT, SCHEMA))
    reader.close()
    # 2^64-1 stored as a REAL partway down: the column is not all integers, so sqlite3 and unknown_id read it.
    reader = _database(tmp_path / "y.sqlite", rows, "UPDATE x SET id = 18446744073709551615 WHERE rowid = 2501")
    assert reader.frame(stored, SCHEMA, ids=("id",)) is None
    reader.close()


@pytest.mark.parametrize(("row", "why"), [
    ((9.3e18, 1, 1, "k", 1.0), "a REAL time partway down an integer column"),
    (("soon", 1, 1, "k", 1.0), "text in an integer column"),
    ((1, 1, 1, b"k\xe4nnel", 1.0), "Latin-1 bytes stored as TEXT, as the test_nsys case"),
])
def test_results_it_cannot_type_are_left_to_sqlite3(tmp_path: Path, row: tuple, why: str) -> None:
    rows = _rows(3000)
    rows[2000] = row
    reader = _database(tmp_path / "x.sqlite", rows, "UPDATE x SET name = CAST(name AS TEXT)")
    assert reader.frame(SELECT, SCHEMA) is None, why
    reader.close()


@pytest.mark.parametrize(("select", "why"), [
    ("SELECT t, id, plane << 40 AS plane, name, bw FROM x", "planes past 32 bits: the schema's Int32 cannot hold"),
    ("SELECT t + 0.0 AS t, id, plane, name, bw FROM x", "whole REAL times (sqlite3 refuses 5.0 as an integer)"),
    ("SELECT t, id, plane, id AS name, bw FROM x", "integers where text is wanted (sqlite3 refuses them)"),
], ids=["int32-overflow", "real-column", "int-as-text"])
def test_a_whole_column_of_another_type_is_left_to_sqlite3(tmp_path: Path, select: str, why: str) -> None:
    reader = _database(tmp_path / "x.sqlite", [(1, 1, 1, "k", 1.0), (2, 2, 1, "k", 1.0)])
    assert reader.frame("SELECT t, id, plane, name, bw FROM x", SCHEMA) is not None  # the columns as they are
    assert reader.frame(select, SCHEMA) is None, why
    reader.close()


def test_without_the_driver_every_query_is_left_to_sqlite3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "adbc_driver_sqlite", None)  # import fails as if absent
    reader = _database(tmp_path / "x.sqlite", _rows(10))
    assert reader.frame(SELECT, SCHEMA) is None


@pytest.mark.parametrize("trace", [*sorted((TRACES / "nsys").glob("*.sqlite")),
                                   TRACES / "ascend" / "torch_npu_2rank_level1_db"], ids=lambda p: p.name)
def test_every_table_is_the_same_through_either_reader(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    native = read_run([trace], "auto", IngestOptions(jobs=1))
    monkeypatch.setattr(ArrowQueries, "frame", lambda *_: None)  # as without the driver: sqlite3 reads all
    rows = read_run([trace], "auto", IngestOptions(jobs=1))
    assert native.frames.keys() == rows.frames.keys()
    for name in native.frames:
        assert_frame_equal(native.table(name), rows.table(name))
    assert native.notes == rows.notes


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's open files in /proc")
def test_reading_a_database_leaves_no_file_open() -> None:
    """Both connections (sqlite3 and the native one) are closed after each rank: a run of a thousand ranks must not
    hold a thousand open files (the usual limit is 1,024)."""
    database = next((TRACES / "ascend" / "torch_npu_2rank_level1_db").rglob("ascend_pytorch_profiler_*.db"))
    rules = load_rules()
    read_database(database, rules, None)  # first use: the driver's own files, once
    before = len(list(Path("/proc/self/fd").iterdir()))
    for _ in range(30):
        read_database(database, rules, None)
    assert len(list(Path("/proc/self/fd").iterdir())) - before < 5
