"""What the store promises when something goes wrong: a failed write changes no byte and leaves no file behind;
a file that is not a store of this schema, a damaged one, a full disk and a lock held by a reader are one line
for every command."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.conftest import TRACES, one_line, run_main, tmpfs
from traceana.errors import TraceanaError

GOOD = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"
BIG = TRACES / "kineto" / "hta_rank0of16_a2a_rs_ag.json.gz"
COMMANDS = (["runs"], ["info"], ["breakdown"], ["sql", "SELECT 1"], ["ingest", str(GOOD)])


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file in ``folder`` with its content hash: a store and any -wal/.tmp beside it."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "t.duckdb"
    assert run_main("ingest", GOOD, "--db", path)[0] == 0
    return path



def _fail_on_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the write fail after the runs, ranks and event tables went in, inside the transaction."""
    import traceana.ingest.run_data as run_data

    real = run_data.conform

    def conform(table, frame):
        if table == "steps":
            raise TraceanaError("injected failure while writing steps")
        return real(table, frame)

    monkeypatch.setattr(run_data, "conform", conform)  # store.write_run imports it when it runs


def test_a_write_failing_midway_changes_no_byte_of_an_existing_store(store, tmp_path, monkeypatch) -> None:
    copy = tmp_path / "s.duckdb"
    shutil.copy(store, copy)
    before = fingerprint(tmp_path)
    _fail_on_steps(monkeypatch)
    line = one_line(*run_main("ingest", BIG, "--db", copy)[::2])
    assert "injected failure while writing steps" in line
    assert fingerprint(tmp_path) == before  # no byte changed, no .wal left beside it


def test_a_write_failing_midway_leaves_no_file_where_none_was(tmp_path, monkeypatch) -> None:
    _fail_on_steps(monkeypatch)
    one_line(*run_main("ingest", GOOD, "--db", tmp_path / "new.duckdb")[::2])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_opening_a_store_rewrites_nothing(store, tmp_path) -> None:
    """Schema and views are created inside the write's transaction only: reports and a re-ingest that fails
    validation leave the bytes as they were."""
    copy = tmp_path / "s.duckdb"
    shutil.copy(store, copy)
    before = fingerprint(tmp_path)
    for args in (["runs"], ["info"], ["breakdown"], ["stragglers"], ["sql", "SELECT count(*) FROM steps"]):
        assert run_main(*args, "--db", copy)[0] == 0, args
    assert fingerprint(tmp_path) == before


def _foreign(path: Path) -> None:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE measurements (t DOUBLE)")


def _older(path: Path, store: Path) -> None:
    shutil.copy(store, path)
    with duckdb.connect(str(path)) as con:
        con.execute("ALTER TABLE ranks DROP COLUMN source")


def _truncated(path: Path, store: Path) -> None:
    data = store.read_bytes()
    path.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize(("make", "message"), [
    (lambda p, s: _foreign(p), "a DuckDB database but not a traceana store (its tables: measurements); pass --db"),
    (_older, "a store of another traceana schema (ranks lacks source); ingest again into a new --db file"),
    (_truncated, "the database file is truncated or damaged; restore it from a copy or ingest again"),
    (lambda p, s: shutil.copy(TRACES / "nsys" / "nsysai_mock_odd_schema.sqlite", p), "not a DuckDB database"),
    (lambda p, s: p.write_text("hello\n"), "not a DuckDB database; pass --db with a traceana store"),
], ids=["foreign", "older-schema", "truncated", "sqlite", "text"])
def test_a_file_that_is_not_this_store_is_one_line_for_every_command(store, tmp_path, make, message) -> None:
    path = tmp_path / "x.duckdb"
    make(path, store)
    before = fingerprint(tmp_path)
    for args in COMMANDS:
        line = one_line(*run_main(*args, "--db", path)[::2])
        assert str(path) in line and message in line, (args, line)
    assert fingerprint(tmp_path) == before


def test_db_argument_that_cannot_be_a_file(tmp_path) -> None:
    loop = tmp_path / "loop.duckdb"
    loop.symlink_to(loop)
    assert "cannot use as --db" in one_line(*run_main("ingest", GOOD, "--db", loop)[::2])
    assert "a folder but not a traceana Parquet dataset (no schema.sql)" in one_line(
        *run_main("runs", "--db", tmp_path)[::2])


def test_ingest_blocked_by_a_reader_says_a_reader_holds_the_file(store, tmp_path, monkeypatch) -> None:
    from traceana.ingest import dispatch

    copy = tmp_path / "s.duckdb"
    shutil.copy(store, copy)
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(copy)!r}, "
                               "read_only=True); print('ready', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        line = one_line(*run_main("ingest", GOOD, "--db", copy)[::2])
        assert "a reader (another traceana command) has this database open; retry when it ends" in line
        monkeypatch.setattr(dispatch, "read_run", lambda *_: pytest.fail("parsed although a reader holds the store"))
        assert one_line(*run_main("ingest", GOOD, "--db", copy)[::2]) == line  # said before parsing
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4.6 MB tmpfs: a real ENOSPC from the kernel."""
    with tmpfs(tmp_path / "disk", "size=4600k") as mount:
        yield mount


def test_disk_full_says_so_and_leaves_the_store_unchanged(store, small_disk) -> None:
    copy = small_disk / "s.duckdb"
    shutil.copy(store, copy)  # 3.9 MB: the 16-rank trace's rows do not fit in what is left
    before = fingerprint(small_disk)
    line = one_line(*run_main("ingest", BIG, "--db", copy)[::2])
    assert line in (f"error: {copy}: no space left on device; the store is unchanged",  # the spill ran out first
                    f"error: {copy}: no space left on device; the store's runs and rows are as they were")
    assert fingerprint(small_disk) == before
    copy.unlink()
    (small_disk / "fill").write_bytes(b"\0" * 3_700_000)
    line = one_line(*run_main("ingest", BIG, "--db", small_disk / "new.duckdb")[::2])
    assert "no space left on device" in line
    assert sorted(p.name for p in small_disk.iterdir()) == ["fill"]


def test_a_disk_that_fills_inside_a_bulk_insert_is_the_no_space_line(small_disk) -> None:
    """A large run's INSERT writes its row groups to the file before COMMIT; the disk filling there aborts the
    transaction, and restoring the memory limit after it (bounded_memory) once raised `TransactionException ...
    please ROLLBACK` instead (a 16-rank, 192,576-event synth run on a 6 MB disk). 2 million random rows are
    that insert."""
    from traceana import store
    from traceana.store.database import bounded_memory

    new = small_disk / "new.duckdb"
    with pytest.raises(TraceanaError) as caught, store.connect(new) as con, \
            store.transaction(con, "CREATE TABLE big (x BIGINT, y BIGINT)"), bounded_memory(con):
        con.execute("INSERT INTO big SELECT range, (random() * 1e18)::BIGINT FROM range(2000000)")
    assert str(caught.value) == f"{new}: no space left on device; the store's runs and rows are as they were"
    assert list(small_disk.iterdir()) == []


def test_an_unexpected_exception_is_one_line_unless_debugging(store, monkeypatch) -> None:
    import traceana.store

    def broken(con, run):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(traceana.store, "open_run", broken)
    code, _, err = run_main("info", "--db", store)
    assert one_line(code, err, expected=1) == (
        "error: internal error: RuntimeError: boom (run again with TRACEANA_DEBUG=1 for the traceback)")
    monkeypatch.setenv("TRACEANA_DEBUG", "1")
    code, _, err = run_main("info", "--db", store)
    assert code == 1 and "Traceback (most recent call last)" in err and "RuntimeError: boom" in err
