"""Shared test helpers: where the shared real traces live, and running the CLI as a user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import chdir, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
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
    read in-process with its format detected and the parse cache beside the store: the analysis tests' fixture."""
    from traceana import store
    from traceana.ingest.dispatch import IngestOptions, read_run
    from traceana.layout import Layout

    with store.connect(db) as con:
        for name, (path, layout) in runs.items():
            options = IngestOptions(layout=None if layout is None else Layout.parse(layout),
                                    cache_dir=db.parent / "cache")
            store.write_run(con, name, read_run([path], "auto", options))
    return db


def job_config(base: dict, **sections: dict) -> Config:
    """The job config ``base`` (a YAML-shaped dict) with ``sections`` merged into its sections, validated as a file
    named gpt.yaml would be: the estimator tests' way to vary one knob against hand formulas."""
    import copy

    from traceana.estimator.config import from_dict

    raw = copy.deepcopy(base)
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return from_dict(raw, "gpt.yaml")
