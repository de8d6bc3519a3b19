"""The Python API: `traceana.open(db)` gives the reports as polars DataFrames, the same numbers the CLI prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import traceana
from tests.conftest import ROOT, SAMPLES, ingested, run_cli
from traceana import store
from traceana.errors import TraceanaError

TOY = "toy8_tp2pp2dp2_1f1b"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("api") / "api.duckdb", {
        TOY: (SAMPLES / TOY, "tp=2,pp=2,dp=2"),
        "moe_balanced": (SAMPLES / "moe_balanced", None)})  # the latest run: methods default to it


def test_import_is_cheap() -> None:
    loaded = subprocess.run([sys.executable, "-c", "import sys, traceana; print(sorted(m for m in ('duckdb', "
                             "'polars', 'matplotlib', 'typer') if m in sys.modules))"],
                            capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert loaded.strip() == "[]"


def test_breakdown_per_stage_matches_the_cli(db: Path) -> None:
    traces = traceana.open(db, run=TOY)
    stages = traces.breakdown(by="stage")
    cli = pl.DataFrame(json.loads(run_cli("breakdown", TOY, "--by", "stage", "--json", "--db", db).stdout))
    assert stages.select(cli.columns[: stages.width]).equals(cli.select(stages.columns))
    # README: stage 0 waits 115.58 ms on TP, 15.11 ms on DP, 70.93 ms on the pipeline in its typical step
    stage0 = stages.filter(pl.col("pp") == 0).row(0, named=True)
    assert [round(stage0[f"{d}_WAIT_mean_ms"], 2) for d in ("MP", "DP", "PP")] == [115.58, 15.11, 70.93]


def test_the_default_run_is_the_latest_and_others_can_be_named(db: Path) -> None:
    traces = traceana.open(db)
    assert traces.runs()["run_id"].to_list() == [TOY, "moe_balanced"]
    assert traces.ranks()["rank"].to_list() == [0, 1, 2, 3]         # moe_balanced: 4 ranks
    assert traces.ranks(run=TOY)["rank"].to_list() == list(range(8))
    assert set(traces.sql("SELECT DISTINCT run_id FROM device_events")["run_id"]) == {TOY, "moe_balanced"}
    assert traces.sql("SELECT DISTINCT run_id FROM device_events", run=TOY)["run_id"].to_list() == [TOY]


def test_timeline_waits_and_collectives_are_the_views_rows(db: Path, tmp_path: Path) -> None:
    traces = traceana.open(db, run=TOY)
    steps = traces.steps()
    assert sorted(set(steps["step"])) == [2, 3] and steps.height == 16
    intervals = traces.timeline()  # the first analysed step: 3
    said = run_cli("timeline", TOY, "--plot", tmp_path / "g.png", "--db", db).stdout
    assert f"(step 3, 8 ranks, {intervals.height} activity intervals)" in said
    counts = traces.sql("SELECT (SELECT count(*) FROM collective_waits) AS waits, "
                        "(SELECT count(*) FROM collective_instances) AS instances").row(0)
    assert (traces.waits().height, traces.collectives().height) == counts
    assert traces.stragglers().height == 8 and set(traces.late_ranks()["dim"]) <= {"TP", "DP", "PP"}


def test_to_pandas(db: Path) -> None:
    pytest.importorskip("pandas", reason="the pandas extra is not installed (pip install 'traceana[pandas]')")
    frame = traceana.open(db, run=TOY).breakdown().to_pandas()
    assert list(frame["rank"]) == list(range(8)) and "MP_WAIT_ms" in frame.columns


def test_mistakes_are_traceana_errors(db: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceanaError, match="no such database"):
        traceana.open(tmp_path / "none.duckdb")
    with pytest.raises(TraceanaError, match="unknown run 'nope'"):
        traceana.open(db, run="nope")
    with pytest.raises(TraceanaError, match="by='host'"):
        traceana.open(db).breakdown(by="host")
    with pytest.raises(TraceanaError, match="query failed"):
        traceana.open(db).sql("SELECT nothing FROM nowhere")


def same(frame: pl.DataFrame, rows: list[dict]) -> None:
    """The API's frame holds exactly the rows the command printed with --json."""
    assert frame.height == len(rows) > 0
    assert frame.equals(pl.DataFrame(rows, schema=frame.schema)), (frame, rows[:3])


def test_analyses_equal_the_commands_json(db: Path) -> None:
    traces = traceana.open(db, run=TOY)

    def cli(*args: object) -> dict | list:
        return json.loads(run_cli(*args, TOY, "--json", "--db", db).stdout)

    path = cli("critical-path")  # the default step on both sides: toy8's steps are 2 and 3, so 3
    assert path["step"] == 3
    for by, key in (("segments", "segments"), ("rank", "by_rank"), ("stage", "by_stage"), ("kind", "by_kind")):
        same(traces.critical_path(by=by), path[key])
    same(traces.critical_path(step=2, by="kind"), cli("critical-path", "--step", 2)["by_kind"])
    same(traces.critical_path(by="communication"), [path["communication"]])
    comm = cli("comm")
    same(traces.comm(), comm["by_op"])
    same(traces.comm_matrix(), comm["matrix"])
    assert traces.slow_links().to_dicts() == comm["slow_links"]
    same(traces.kernels(), cli("kernels"))
    same(traces.kernels(top=3, by="stage"), cli("kernels", "--top", 3, "--by", "stage"))
    same(traces.idle(), cli("idle")["ranks"])
    same(traces.memory(), cli("memory"))
    both = json.loads(run_cli("diff", TOY, "moe_balanced", "--json", "--db", db).stdout)
    same(traces.diff(TOY, "moe_balanced"), both["breakdown"])
    same(traces.diff(TOY, "moe_balanced", part="collectives"), both["collectives"])
    kernels = traces.diff(TOY, "moe_balanced", part="kernels")
    same(kernels.filter(pl.col("status") == "both").head(15), both["kernels_changed"])
    with pytest.raises(TraceanaError, match="by='hop'"):
        traces.critical_path(by="hop")
    with pytest.raises(TraceanaError, match="no-such-run"):
        traces.diff(TOY, "no-such-run")


def test_step_median_and_all_as_the_commands_take_them(db: Path) -> None:
    """step="median" is the step `--step median` resolves to, in every method that takes a step; "all" only where
    the answer is per step (replay), and other words are the CLI's one-line error."""
    traces = traceana.open(db, run=TOY)

    def cli(*args: object) -> dict:
        return json.loads(run_cli(*args, TOY, "--step", "median", "--json", "--db", db).stdout)

    path = cli("critical-path")
    same(traces.critical_path(step="median", by="kind"), path["by_kind"])
    same(traces.critical_path(step=path["step"], by="kind"), path["by_kind"])
    idle = cli("idle")
    assert idle["step"] == path["step"]
    same(traces.idle(step="median"), idle["ranks"])
    assert traces.replay(step="all").equals(traces.replay())
    with pytest.raises(TraceanaError, match=r"^--step 'all': give a step number or 'median'$"):
        traces.idle(step="all")
    with pytest.raises(TraceanaError, match=r"^--step 'middle': give a step number, 'median' or 'all'$"):
        traces.replay(step="middle")

def test_the_docs_python_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # the store docs/python.md says: the README's first command's sample and the two it names; the block then runs
    # from the checkout, with the store's file name pointed here
    readme = (ROOT / "docs" / "python.md").read_text()
    assert "traceana ingest sample_traces/traces/pp2_mb1 && traceana ingest sample_traces/traces/pp2_mb8" in readme
    path = tmp_path / "traceana.duckdb"
    ingested(path, {TOY: (SAMPLES / TOY, "tp=2,pp=2,dp=2"), **{n: (SAMPLES / n, None) for n in ("pp2_mb1", "pp2_mb8")}})
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.count('"traceana.duckdb"') == 1
    monkeypatch.chdir(ROOT)
    exec(compile(block.replace('"traceana.duckdb"', repr(str(path))), "docs/python.md", "exec"), {})
    assert "MP_WAIT_mean_ms" in capsys.readouterr().out  # its print


def test_a_session_reads_through_one_connection_and_releases_it(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = traceana.open(db)
    outside = traces.breakdown()
    opened: list[object] = []
    real = store.connect

    def counting(*args: object, **kwargs: object) -> object:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "connect", counting)
    with traces.session() as held:
        same_rows = held.breakdown().equals(outside)
        held.stragglers()
        held.kernels()
        held.idle()
        with traces.session():  # nested: still the one connection
            held.comm()
    assert same_rows and len(opened) == 1
    traces.ranks()  # outside again: a connection of its own
    assert len(opened) == 2


def test_a_session_shows_the_run_it_reads_and_every_run_where_a_call_spans_them(db: Path) -> None:
    """Reads of one run see that run's rows only (store.open_run); within one session a call over the whole store
    (runs, SQL without a run, diff) sees every run again, and a read of another run sees that one."""
    traces = traceana.open(db)
    toy, moe = traces.breakdown(run=TOY), traces.breakdown(run="moe_balanced")
    with traces.session() as held:
        assert held.breakdown(run=TOY).equals(toy)
        assert held.sql("SELECT DISTINCT run_id FROM device_events", run=TOY)["run_id"].to_list() == [TOY]
        assert held.runs()["run_id"].to_list() == [TOY, "moe_balanced"]
        assert set(held.sql("SELECT DISTINCT run_id FROM device_events")["run_id"]) == {TOY, "moe_balanced"}
        assert held.breakdown().equals(moe)  # the default, the latest run
        assert held.breakdown(run=TOY).equals(toy)
        assert set(held.diff(TOY, "moe_balanced")["stage"].to_list()) >= {0, 1}
        assert held.ranks(run=TOY)["rank"].to_list() == list(range(8))
