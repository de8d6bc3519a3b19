"""`idle`: IDLE split by cause. The H200 host-bound trace against its raw JSON (kernels, and the runtime calls that
launched them by correlation id, read here with the standard library), an Ascend run with device sync tasks, and a
CPU-only sample without launch records."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.conftest import SAMPLES, TRACES, ingested
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses.idle import idle_causes
from traceana.cli.main import app
from traceana.ingest.dispatch import IngestOptions, read_run

HOSTBOUND = TRACES / "kineto" / "h200_hostbound_h512_L12_s256_gb8.json.gz"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("idle") / "t.duckdb", {
        "hostbound": (HOSTBOUND, None), "npu": (TRACES / "ascend" / "torch_npu_2rank_level1", None),
        "moe_skewed": (SAMPLES / "moe_skewed", EXPERIMENTS["moe_skewed"][0])})


@pytest.fixture
def con(db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with store.connect(db, read_only=True) as connection:
        yield connection


def _raw_host_launch_ns(windows: list[tuple[int, int, int]]) -> dict[int, tuple[int, int]]:
    """Per step: (idle ns inside the window, ns of interior gaps whose next kernel was launched after they began)."""
    with gzip.open(HOSTBOUND) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    ns = lambda us: base + round(us * 1000)  # noqa: E731
    launch: dict[int, int] = {}
    for e in raw["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            corr = e["args"]["correlation"]
            launch[corr] = min(launch.get(corr, ns(e["ts"])), ns(e["ts"]))
    kernels = sorted((ns(e["ts"]), ns(e["ts"]) + round(e.get("dur", 0) * 1000), e["args"].get("correlation"))
                     for e in raw["traceEvents"]
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    result = {}
    for step, w0, w1 in windows:
        idle = host = 0
        reach = w0
        for start, end, corr in kernels:
            if end <= w0 or start >= w1 or end <= start:
                continue
            start, end = max(start, w0), min(end, w1)
            if start > reach:
                idle += start - reach
                if reach > w0 and launch[corr] > reach:  # an interior gap whose next kernel came late
                    host += start - reach
            reach = max(reach, end)
        result[step] = (idle + w1 - reach, host)
    return result


def test_hostbound_trace_is_host_bound(con: duckdb.DuckDBPyConnection) -> None:
    windows = con.execute("SELECT step, start_ns, end_ns FROM step_windows WHERE run_id = 'hostbound'").fetchall()
    expected = _raw_host_launch_ns(windows)
    got = dict(con.execute("SELECT step, sum(end_ns - start_ns) FILTER (WHERE cause = 'host_launch') "
                           "FROM idle_gaps WHERE run_id = 'hostbound' GROUP BY step").fetchall())
    idle = dict(con.execute("SELECT step, IDLE_ns FROM rank_step_breakdown WHERE run_id = 'hostbound'").fetchall())
    for step, (raw_idle, raw_host) in expected.items():
        assert idle[step] == raw_idle
        assert got[step] == raw_host
        assert raw_host > 0.9 * raw_idle  # ~90% of the step is idle, nearly all of it waiting for launches
    typical = idle_causes(con, "hostbound").row(0, named=True)
    assert typical["host_launch_ms"] > 0.95 * typical["IDLE_ms"]


def test_every_idle_ns_has_one_cause(con: duckdb.DuckDBPyConnection) -> None:
    rows = con.execute("SELECT b.run_id, b.rank, b.step, b.IDLE_ns, coalesce(sum(g.end_ns - g.start_ns), 0) "
                       "FROM rank_step_breakdown b LEFT JOIN idle_gaps g USING (run_id, rank, step) "
                       "GROUP BY ALL").fetchall()
    assert rows and all(idle == gaps for *_, idle, gaps in rows)
    # a gap inside its window ends where an event starts: the view joins on that instant (queries/15_idle_gaps.sql)
    (orphans,) = con.execute("SELECT count(*) FROM idle_gaps g JOIN step_windows w USING (run_id, rank, step) "
                             "WHERE g.end_ns < w.end_ns AND g.next_event_id IS NULL").fetchall()[0]
    assert orphans == 0


def test_ascend_sync_tasks_and_no_launch_records(con: duckdb.DuckDBPyConnection, db: Path,
                                                  tmp_path: Path) -> None:
    # The Ascend text export has EVENT_WAIT / EVENT_RECORD device tasks but no host launch correlation.
    causes = dict(con.execute("SELECT cause, count(*) FROM idle_gaps WHERE run_id = 'npu' GROUP BY ALL").fetchall())
    assert causes.keys() <= {"sync_wait", "step_boundary", "unknown"} and causes["sync_wait"] > 0
    result = CliRunner().invoke(app, ["idle", "moe_skewed", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert "no launch records" in payload["note"]
    assert all(r["host_launch_ms"] == 0 and r["unknown_ms"] > 0 for r in payload["ranks"])
    png = tmp_path / "idle.png"
    result = CliRunner().invoke(app, ["idle", "hostbound", "--db", str(db), "--plot", str(png)])
    assert result.exit_code == 0 and "host_launch ms" in result.stdout and png.stat().st_size > 10_000
    result = CliRunner().invoke(app, ["idle", "hostbound", "--db", str(db), "--step", "7"])
    assert result.exit_code != 0 and "no such step" in str(result.exception)


def test_nsys_launch_times_against_the_sqlite(tmp_path: Path) -> None:
    # Second route: the export's own tables joined by correlation id in SQLite.
    import sqlite3

    export = TRACES / "nsys" / "pipit_cloverleaf_4gpu_nsys2024.5.sqlite"
    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as lite:  # one process: correlation ids are unique
        tables = {t for (t,) in lite.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        launch: dict[int, int] = {}
        for corr, start in lite.execute("SELECT correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            launch[corr] = min(launch.get(corr, start), start)
        device = [row for t in ("KERNEL", "MEMCPY", "MEMSET") if f"CUPTI_ACTIVITY_KIND_{t}" in tables
                  for row in lite.execute(f"SELECT start, correlationId FROM CUPTI_ACTIVITY_KIND_{t}")]
    expected = sorted((start, launch[corr]) for start, corr in device if corr in launch)
    with store.connect(tmp_path / "n.duckdb") as con:
        store.write_run(con, "n", read_run([export], "nsys", IngestOptions(cache_dir=tmp_path / "cache")))
        got = con.execute("SELECT start_ns, launch_ns FROM device_events WHERE launch_ns IS NOT NULL "
                          "ORDER BY ALL").fetchall()
    assert len(expected) > 1000 and got == expected


def _cells(args: list[str], column: str) -> dict[str, str]:
    """rank -> the text of ``column`` (its value, a share in parentheses cut off) in the command's table, printed on
    a 250-column console (the module's console takes its width once, at import)."""
    from unittest.mock import patch

    from rich.console import Console

    from traceana.render import console

    with patch.object(console, "console", Console(width=250, color_system=None)):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [[c.strip() for c in line.strip("│┃").split("│" if line.startswith("│") else "┃")]
            for line in result.output.splitlines() if line.startswith(("│", "┃"))]
    at = rows[0].index(column)
    return {row[0]: row[at].split(" (")[0] for row in rows[1:]}


@pytest.mark.parametrize("run", ["hostbound", "npu", "moe_skewed"])
def test_idle_prints_the_idle_time_breakdown_prints(db: Path, run: str) -> None:
    """Issue 35: idle printed 12,850 ms (4 significant figures) where breakdown printed 12,854.103 for the same
    IDLE; one table printer (one decimals rule per column) prints the same value the same in both."""
    idle = _cells(["idle", run, "--db", str(db)], "IDLE_ms")
    breakdown = _cells(["breakdown", run, "--db", str(db)], "IDLE ms (%)")
    assert idle and idle == breakdown
