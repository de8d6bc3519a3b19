"""The store's promises (atomic, idempotent, one writer) and one-line errors for bad input, case by case."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import TRACES, run_cli

GOOD = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "t.duckdb"
    run_cli("ingest", GOOD, "--db", path)
    return path


def counts(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM device_events), "
                           "(SELECT count(*) FROM collectives), (SELECT count(*) FROM steps)").fetchall()


def test_reingest_replaces_the_run(db: Path) -> None:
    before = counts(db)
    run_cli("ingest", GOOD, "--db", db)
    assert counts(db) == before
    assert before[0][0] == 1


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    raw = gzip.decompress(GOOD.read_bytes())
    (tmp / "empty.json").write_bytes(b"")
    (tmp / "truncated.json.gz").write_bytes(GOOD.read_bytes()[: len(GOOD.read_bytes()) // 2])
    (tmp / "half.json").write_bytes(raw[: len(raw) // 2])
    (tmp / "notes.txt").write_text("hello")
    (tmp / "empty_dir").mkdir()
    (tmp / "dup").mkdir()
    (tmp / "dup" / "a.json.gz").write_bytes(GOOD.read_bytes())
    (tmp / "dup" / "b.json.gz").write_bytes(gzip.compress(raw + b"\n"))  # another file, the same rank
    (tmp / "twice").mkdir()
    (tmp / "twice" / "a.json.gz").write_bytes(GOOD.read_bytes())
    (tmp / "twice" / "b.json.gz").write_bytes(GOOD.read_bytes())
    return {
        "empty file": ([str(tmp / "empty.json")], "empty.json: the file is empty"),
        "truncated gzip": ([str(tmp / "truncated.json.gz")], "truncated.json.gz: not a readable Kineto trace"),
        "JSON cut in half": ([str(tmp / "half.json")], "half.json: not a readable Kineto trace"),
        "unknown format": ([str(tmp / "notes.txt")], "notes.txt: unknown trace format"),
        "nothing to ingest": ([str(tmp / "empty_dir")], "empty_dir: nothing to ingest here"),
        "missing path": ([str(tmp / "nope.json")], "nope.json: no such file or directory"),
        "duplicate ranks": ([str(tmp / "dup")], "rank 0 is also claimed by"),
        "one trace twice": ([str(tmp / "twice")], "b.json.gz: the same trace as"),
        "layout world size": ([str(GOOD), "--layout", "tp=2,dp=2"], "trace has 2 ranks but layout"),
        "unknown dimension": ([str(GOOD), "--layout", "tp=2,zp=1"], "unknown dimension 'zp'"),
        "bad step marker": ([str(GOOD), "--step-marker", "(("], "--step-marker '((': not a regular expression"),
    }


def test_bad_inputs_one_line_nonzero_and_database_untouched(db: Path, tmp_path: Path) -> None:
    before = digest(db)
    for case, (args, message) in _bad_inputs(tmp_path).items():
        result = run_cli("ingest", *args, "--db", db, check=False)
        assert result.returncode == 2, case
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, result.stderr)
        assert message in lines[0], (case, lines[0])
        assert "Traceback" not in result.stderr
    assert digest(db) == before


def test_failed_first_ingest_creates_no_database(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_bytes(b"")
    result = run_cli("ingest", tmp_path / "empty.json", "--db", tmp_path / "new.duckdb", check=False)
    assert result.returncode == 2
    assert not (tmp_path / "new.duckdb").exists()


def test_second_concurrent_writer_gets_a_clear_error(db: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db)!r}); "
                               "print('ready', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = run_cli("ingest", GOOD, "--db", db, check=False)
        assert result.returncode == 2
        assert "another traceana process is writing this database" in result.stderr
    finally:
        holder.kill()
        holder.wait()
        time.sleep(0.1)


def test_unknown_run_and_bad_sql(db: Path) -> None:
    result = run_cli("info", "no_such_run", "--db", db, check=False)
    assert result.returncode == 2 and "unknown run 'no_such_run'" in result.stderr
    result = run_cli("sql", "SELECT * FROM nowhere", "--db", db, check=False)
    assert result.returncode == 2 and result.stderr.startswith("error: query failed")


def test_sql_and_info_json(db: Path) -> None:
    out = run_cli("sql", "SELECT count(*) AS n FROM collectives", "--db", db, "--format", "csv").stdout
    assert out.splitlines() == ["n", "21"]
    assert '"process_groups"' in run_cli("info", "--db", db, "--json").stdout


def test_reports_read_alongside_another_reader_and_use_this_versions_views(db: Path, tmp_path: Path) -> None:
    """Read-only opens take no lock against each other, and define the installed views as temporary views that
    shadow whatever an older traceana stored (here: a stored rank_step_breakdown that returns nothing)."""
    copy = tmp_path / "old.duckdb"
    copy.write_bytes(db.read_bytes())
    with duckdb.connect(str(copy)) as con:
        con.execute("CREATE OR REPLACE VIEW rank_step_breakdown AS SELECT * FROM runs WHERE false")
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(copy)!r}, "
                               "read_only=True); print('ready', flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        out = run_cli("sql", "SELECT count(*) AS n FROM rank_step_breakdown", "--db", copy, "--format", "csv").stdout
        steps = run_cli("sql", "SELECT count(*) AS n FROM steps", "--db", copy, "--format", "csv").stdout
        assert out == steps and out.splitlines()[1] != "0"
    finally:
        holder.kill()
        holder.wait()
