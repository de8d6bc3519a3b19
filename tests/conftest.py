"""Shared test helpers: where the shared real traces live, and running the CLI as a user does."""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import chdir, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import duckdb

    from traceana.estimator.config import Config

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
SAMPLES = ROOT / "sample_traces" / "traces"
NSYS_REPORTS = ROOT / "sample_traces" / "nsys"  # .nsys-rep files: reading them needs `nsys export`
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys is not on PATH: a .nsys-rep is read "
                                "through `nsys export` (Debian non-free nsight-systems; sample_traces/nsys/record.sh)")


def params(names: object, needing_nsys: set[str]) -> list:
    """pytest parameters for ``names``, those in ``needing_nsys`` skipped (with the reason) where nsys is missing."""
    return [pytest.param(n, marks=needs_nsys) if n in needing_nsys else n for n in names]


def run_cli(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `traceana ARGS` from the project folder; with check, fail the test on a non-zero exit. In this process
    through run_main (an interpreter start and the imports cost 0.4 s a command, a quarter of the suite's time when
    every call paid them), except what must own its process: `--executor ray` (Ray's processes live and die with the
    command's) and `mcp` (a stdio server), which run as `python -m traceana`."""
    argv = [str(a) for a in args]
    if argv[:1] == ["mcp"] or "--executor" in argv:
        result = subprocess.run([sys.executable, "-m", "traceana", *argv], capture_output=True, text=True, cwd=ROOT,
                                timeout=600)
    else:
        with chdir(ROOT):
            result = subprocess.CompletedProcess(["traceana", *argv], *run_main(*argv))
    if check and result.returncode != 0:
        pytest.fail(f"traceana {' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return result


@pytest.fixture
def cli():
    return run_cli


def run_main(*args: object) -> tuple[int, str, str]:
    """Run the CLI's entry point in this process, as `traceana ARGS` would: (exit code, stdout, stderr). No
    interpreter start per call, so property tests can afford hundreds of them."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from traceana.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, out.getvalue(), err.getvalue()


def query(db: Path, sql: str, *params: object) -> list[tuple]:
    """Rows of ``sql`` on the store at ``db``, opened read-only: the tests' second route to a stored number."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def union_length(intervals: list[tuple[Any, Any]]) -> Any:
    """Length of the union of [start, end) intervals (int ns or Decimal us, as the raw file gives them): the
    hand calculation a breakdown's busy time is checked against."""
    total, start, end = 0, None, None
    for s, e in sorted(intervals):
        if start is None or s > end:
            total += (end - start) if start is not None else 0
            start, end = s, e
        else:
            end = max(end, e)
    return total + ((end - start) if start is not None else 0)


def one_line(code: int, err: str, expected: int = 2) -> str:
    """The one `error: ...` line a command printed, asserting it exited ``expected`` and printed nothing else."""
    lines = err.strip().splitlines()
    assert code == expected and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


@contextmanager
def tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mount`` with ``options`` (a real ENOSPC or EROFS from the kernel) for the test's time.
    Mounting needs root (CI runs as root); elsewhere the test skips."""
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def store_rows(db: Path) -> dict[str, list[tuple]]:
    """Every run table of a store (a .duckdb file or a Parquet dataset) as its sorted rows, the column names first;
    runs without ``ingested_at`` (the ingest's clock), so two ingests of the same inputs compare equal."""
    from traceana import store
    from traceana.ingest.run_data import TABLES

    out = {}
    with store.connect(db, read_only=True, views=False) as con:
        for name in ("runs", *TABLES):
            result = con.execute(f"SELECT COLUMNS(lambda c: c != 'ingested_at') FROM {name}")
            out[name] = [tuple(c[0] for c in result.description), *sorted(result.fetchall(), key=repr)]
    return out


def ingested(db: Path, runs: dict[str, tuple[Path, str | None]]) -> Path:
    """A store at ``db`` holding each run (name -> its trace file or folder and the ``--layout`` it needs, or None),
    its format detected: the analysis tests' fixture (each run parsed once per session: :func:`add_run`)."""
    from traceana import store

    with store.connect(db) as con:
        for name, (path, layout) in runs.items():
            add_run(con, name, [path], layout=layout)
    return db


def add_run(con: duckdb.DuckDBPyConnection, run_id: str, paths: list[Path], fmt: str = "auto",
            layout: str | None = None) -> None:
    """Write run ``run_id`` of ``paths`` into the store at ``con`` as `traceana ingest` would (read_run, write_run),
    for stores the analysis tests read: the run is parsed once per test session, into a store of its own that
    every worker shares (RUN_CACHE, built under a lock), and copied from there (twenty modules read the same
    samples and shared traces: parsing each every time cost a minute of the suite). ``ingested_at`` is the copy's,
    so the latest run is the last one added, as with ingest. The ingest tests read their traces themselves."""
    from traceana import store
    from traceana.ingest.run_data import TABLES

    cached = _parsed_once([Path(p) for p in paths], fmt, layout)
    con.execute(f"ATTACH '{cached}' AS cached (READ_ONLY)")
    try:
        with store.transaction(con):
            for table in ("runs", *TABLES):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                con.execute(f"INSERT INTO {table} BY NAME SELECT * REPLACE (?::VARCHAR AS run_id) FROM cached.{table}",
                            [run_id])
            con.execute("UPDATE runs SET ingested_at = ? WHERE run_id = ?",
                        [dt.datetime.now(dt.UTC).replace(tzinfo=None), run_id])
    finally:
        con.execute("DETACH cached")


def _parsed_once(paths: list[Path], fmt: str, layout: str | None) -> Path:
    """The store holding ``paths`` read with ``fmt`` and ``layout`` (run id "run"), built by the first worker that
    asks for it."""
    from traceana import store
    from traceana.ingest.dispatch import IngestOptions, detect, read_run
    from traceana.layout import Layout

    if fmt == "auto":  # as read_run decides it: one parse for a trace read as "auto" and by its format's name
        fmt = detect(paths[0])
    key = hashlib.sha256(repr(([str(p.resolve()) for p in paths], fmt, layout)).encode()).hexdigest()[:16]
    target = Path(os.environ[RUN_CACHE]) / f"{key}.duckdb"
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            building = target.with_suffix(".building")
            building.unlink(missing_ok=True)
            options = IngestOptions(layout=None if layout is None else Layout.parse(layout),
                                    cache_dir=target.parent / "exports")
            with store.connect(building) as con:
                store.write_run(con, "run", read_run(paths, fmt, options))
            building.rename(target)
    return target


RUN_CACHE = "TRACEANA_TEST_RUN_CACHE"  # the folder of add_run's parsed runs: one per session, all workers


def pytest_configure(config: pytest.Config) -> None:
    if RUN_CACHE not in os.environ:  # the controller (or a run without -n); workers inherit its folder
        os.environ[RUN_CACHE] = tempfile.mkdtemp(prefix="traceana-test-runs-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(RUN_CACHE), ignore_errors=True))


def job_config(base: dict, **sections: dict) -> Config:
    """The job config ``base`` (a YAML-shaped dict) with ``sections`` merged into its sections, validated as a file
    named gpt.yaml would be: the estimator tests' way to vary one knob against hand formulas."""
    import copy

    from traceana.estimator.config import from_dict

    raw = copy.deepcopy(base)
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return from_dict(raw, "gpt.yaml")
