"""collective_waits, collective_instances and stragglers on a hand-built 4-rank, 2-stage run (expected numbers by
hand in the comments), and the `stragglers` command on it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from tests.analyses.test_breakdown import Event, run_data
from traceana import store
from traceana.cli.main import app

# Stage 0 = ranks 0, 1; stage 1 = ranks 2, 3. Step 0 [-1000, 0) is warm-up; step 1 [0, 2000) is the typical step.
EVENTS: list[Event] = [
    (0, -900, -100, "compute", None),                         # warm-up only: left out of the typical step
    (0, 0, 100, "compute", None), (1, 0, 100, "compute", None),
    (2, 0, 300, "compute", None), (3, 0, 200, "compute", None),
    # instance 1, all four ranks: arrivals 500, 520, 600 (rank 2, last), 550; ends 700
    (0, 500, 700, "comm", "DP"), (1, 520, 700, "comm", "DP"), (2, 600, 700, "comm", "DP"), (3, 550, 700, "comm", "DP"),
    # instance 2: a pipeline pair, rank 3 arrives 50 ns after rank 1
    (1, 800, 900, "comm", "PP"), (3, 850, 900, "comm", "PP"),
    # instance 3: only rank 0 was traced, so nobody can be called late
    (0, 1000, 1010, "comm", "TP"),
    # instance 4: rank 0's kernel ended (1010) before rank 1 arrived (1100): it waited 10, its whole kernel
    (0, 1000, 1010, "comm", "TP"), (1, 1100, 1200, "comm", "TP"),
]
INSTANCE_OF = {5: 1, 6: 1, 7: 1, 8: 1, 9: 2, 10: 2, 11: 3, 12: 4, 13: 4}
STEPS = [(r, s, -1000 + 1000 * s, 2000 * s) for r in range(4) for s in (0, 1)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "s.duckdb"
    data = run_data(EVENTS, STEPS, pp={0: 0, 1: 0, 2: 1, 3: 1},
                    instances={(EVENTS[i][0], i): inst for i, inst in INSTANCE_OF.items()})
    with store.connect(path) as con:
        store.write_run(con, "r", data)
    return path


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_collective_waits_and_instances(db: Path) -> None:
    assert rows(db, "SELECT instance, rank, wait_ns, arrival FROM collective_waits ORDER BY instance, rank") == [
        (1, 0, 100, 4), (1, 1, 80, 3), (1, 2, 0, 1), (1, 3, 50, 2),
        (2, 1, 50, 2), (2, 3, 0, 1),
        (3, 0, 0, 1),
        (4, 0, 10, 2), (4, 1, 0, 1),
    ]
    got = rows(db, "SELECT instance, dim, ranks_seen, ranks, start_spread_ns, end_spread_ns, last_rank, "
                   "total_wait_ns, max_wait_ns FROM collective_instances ORDER BY instance")
    assert got == [
        (1, "DP", 4, [0, 1, 2, 3], 100, 0, 2, 230, 100),
        (2, "PP", 2, [1, 3], 50, 0, 3, 50, 50),
        (3, "TP", 1, [0], 0, 0, 0, 0, 0),
        (4, "TP", 2, [0, 1], 100, 190, 1, 10, 10),
    ]


def test_stragglers_view(db: Path) -> None:
    got = rows(db, "SELECT rank, pp, steps, COMP_ns, stage_median_COMP_ns, COMP_excess_pct, straggler_stage, "
                   "last_arrivals, caused_wait_ns FROM stragglers ORDER BY rank")
    assert got == [
        (0, 0, 1, 100.0, 100.0, 0.0, False, 0, 0),        # instance 3 (only rank 0 traced) is not counted
        (1, 0, 1, 100.0, 100.0, 0.0, False, 1, 10),
        (2, 1, 1, 300.0, 250.0, 20.0, True, 1, 230),      # stage 1 mean COMP 250 > stage 0's 100
        (3, 1, 1, 200.0, 250.0, -20.0, True, 1, 50),
    ]


def test_stragglers_command(db: Path) -> None:
    result = CliRunner().invoke(app, ["stragglers", "--db", str(db), "--threshold", "10", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["straggler_stage"] == 1
    assert [r["rank"] for r in report["straggler_ranks"]] == [2]
    assert report["straggler_ranks"][0]["COMP_excess_pct"] == pytest.approx(20.0)
    assert [(r["rank"], r["caused_wait_ms"]) for r in report["late_ranks"]] == [(2, 230e-6), (3, 50e-6), (1, 10e-6)]
    text = CliRunner().invoke(app, ["stragglers", "--db", str(db)])
    assert text.exit_code == 0 and "stage 1" in text.output
    bad = CliRunner().invoke(app, ["stragglers", "--db", str(db), "--threshold", "-5"])
    assert bad.exit_code != 0
