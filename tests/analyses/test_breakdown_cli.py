"""The `breakdown` and `timeline` commands on a hand-built two-stage run (numbers by hand in the comments)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import patch

import polars as pl
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.analyses.test_breakdown import Event, run_data
from traceana import store
from traceana.cli.main import app, main
from traceana.render import console

# Ranks 0 (stage 0) and 1 (stage 1); steps 0 = [0, 1000) (warm-up) and 1 = [1000, 2000) (the typical step).
EVENTS: list[Event] = [
    (0, 0, 1000, "compute", None),
    (0, 1000, 1400, "compute", None), (0, 1300, 1500, "comm", "TP"),   # COMP 400, MP_WAIT 100, overlapped 100
    (1, 1000, 1200, "compute", None), (1, 1200, 1800, "comm", "PP"),   # COMP 200, PP_WAIT 600
]
STEPS = [(r, s, 1000 * s, 1000 * (s + 1)) for r in (0, 1) for s in (0, 1)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "c.duckdb"
    with store.connect(path) as con:
        store.write_run(con, "two", run_data(EVENTS, STEPS, pp={0: 0, 1: 1}))
    return path


def invoke(*args: str) -> tuple[int, str]:
    """The command's output on a 200-column console (the module's console takes its width once, at import: under
    pytest-xdist COLUMNS is 80)."""
    with patch.object(console, "console", Console(width=200, color_system=None)):
        result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_breakdown_json_per_rank_is_the_typical_step(db: Path) -> None:
    code, out = invoke("breakdown", "--db", str(db), "--json")
    assert code == 0, out
    rows = {r["rank"]: r for r in json.loads(out)}
    assert rows[0]["steps"] == 1 and rows[0]["COMP_ms"] == pytest.approx(400e-6)
    assert rows[0]["MP_WAIT_ms"] == pytest.approx(100e-6) and rows[0]["OVERLAPPED_ms"] == pytest.approx(100e-6)
    assert rows[0]["IDLE_pct"] == pytest.approx(50.0)          # 500 of 1000 ns
    assert rows[1]["PP_WAIT_pct"] == pytest.approx(60.0) and rows[1]["COMP_pct"] == pytest.approx(20.0)


def test_breakdown_per_stage_for_one_step_and_its_table(db: Path) -> None:
    code, out = invoke("breakdown", "--db", str(db), "--by", "stage", "--step", "0", "--json")
    assert code == 0, out
    assert [(r["pp"], r["ranks"], r["COMP_mean_ms"]) for r in json.loads(out)] == [(0, 1, 1e-3), (1, 1, 0.0)]
    code, out = invoke("breakdown", "--db", str(db), "--by", "stage")
    assert code == 0 and "PP_WAIT ms (%)" in out and "CP_WAIT" not in out  # dims that never wait are left out


@pytest.mark.parametrize(("steps", "title"), [
    (STEPS, "typical step (mean over steps after the first)"),
    ([s for s in STEPS if s[1] == 1], "step 1, the run's only step"),
    ([], "the whole trace as one step (no step markers)"),
])
def test_titles_say_which_step_and_name_tp(tmp_path: Path, steps: list[tuple[int, int, int, int]],
                                           title: str) -> None:
    path = tmp_path / "t.duckdb"
    with store.connect(path) as con:
        store.write_run(con, "two", run_data(EVENTS, steps, pp={0: 0, 1: 1}))
    code, out = invoke("breakdown", "--db", str(path))
    assert code == 0 and f"two: breakdown per rank, {title}" in out
    assert "MP_WAIT (TP) ms (%)" in out  # the column is MP_WAIT; what people read says what it is


def test_breakdown_and_timeline_plots(db: Path, tmp_path: Path) -> None:
    bars, gantt = tmp_path / "bars.png", tmp_path / "gantt.png"
    assert invoke("breakdown", "--db", str(db), "--plot", str(bars))[0] == 0
    code, out = invoke("timeline", "--db", str(db), "--step", "1", "--plot", str(gantt))
    assert code == 0 and "2 ranks" in out
    for png in (bars, gantt):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_defaults_to_the_first_analysed_step_and_info_lists_steps(db: Path, tmp_path: Path) -> None:
    code, out = invoke("timeline", "--db", str(db), "--plot", str(tmp_path / "g.png"))
    assert code == 0 and "(step 1, 2 ranks" in out  # step 0 is warm-up; 1 is the first the typical step averages
    code, out = invoke("info", "--db", str(db), "--json")
    assert code == 0, out
    assert [(s["step"], s["ranks"], s["mean_ms"]) for s in json.loads(out)["steps"]] == [(0, 2, 1e-3), (1, 2, 1e-3)]


@pytest.mark.parametrize(("args", "message"), [
    (("breakdown", "--by", "host"), "--by 'host': choose rank or stage"),
    (("breakdown", "--step", "7"), "--step 7: run 'two' has no such step (steps: 0, 1)"),
    (("timeline", "--step", "9", "--plot", "x.png"), "--step 9"),
    (("breakdown", "nope"), "unknown run 'nope'"),
])
def test_user_mistakes_are_one_line_errors(db: Path, args: tuple[str, ...], message: str,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["traceana", *args, "--db", str(db)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1


def test_info_sorts_process_group_ids_as_numbers(tmp_path: Path) -> None:
    # toy8's groups came out 10, 11, 12, 9 (text order); named groups (Ascend's) follow the numbered ones
    data = run_data(EVENTS, STEPS, pp={0: 0, 1: 1})
    data.frames["process_groups"] = pl.DataFrame({"pg": ["10", "hccl_world", "9", "11", "2"], "dim": ["DP"] * 5,
                                                  "ranks": [[0, 1]] * 5, "source": ["trace"] * 5})
    path = tmp_path / "g.duckdb"
    with store.connect(path) as con:
        store.write_run(con, "two", data)
    code, out = invoke("info", "--db", str(path), "--json")
    assert code == 0, out
    assert [g["pg"] for g in json.loads(out)["process_groups"]] == ["2", "9", "10", "11", "hccl_world"]
    code, out = invoke("info", "--db", str(path))
    assert [line.split("│")[1].strip() for line in out.splitlines() if "│ DP " in line] == \
        ["2", "9", "10", "11", "hccl_world"]
