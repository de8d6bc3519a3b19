"""`traceana compare` on the sample traces (real gloo CPU runs): one run and the seed-002 sweep, each number checked
by a second route — measured ones by plain SQL over the breakdown views, estimated ones by the estimator's own
per-stage frame, statistics by numpy — and every bad input as a one-line error with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from tests.analyses.test_breakdown import run_data
from tests.conftest import ROOT, SAMPLES, add_run, run_cli
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.estimator import config
from traceana.estimator.estimate import estimate
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.model.compare import compare_run

CONFIGS = ROOT / "sample_traces" / "configs"
SWEEP = ROOT / "examples" / "sample_traces_sweep.yaml"
DIMS = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT", "IDLE", "TOTAL")


def sample_store(path: Path) -> Path:
    """Every sample run ingested with its layout into ``path``, as `traceana ingest DIR --layout SPEC` stores it."""
    with store.connect(path) as con:
        for name, (layout, _) in EXPERIMENTS.items():
            add_run(con, name, [SAMPLES / name], "kineto", layout)
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_store(tmp_path_factory.mktemp("compare") / "samples.duckdb")


def compare_json(*args: object) -> dict:
    return json.loads(run_cli("compare", *args, "--json").stdout)


def sql_rows(db: Path, query: str, *params: object) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(query, list(params)).fetchall()


@pytest.mark.parametrize("name", ["toy8_tp2pp2dp2_1f1b", "moe_skewed"])
def test_one_run_is_reproduced_by_sql_over_the_views(db: Path, name: str) -> None:
    cfg_path = CONFIGS / f"{name}.yaml"
    out = compare_json("--estimate", cfg_path, name, "--db", db)
    by_dim = {r["dim"]: r for r in out["by_dimension"]}
    # measured: mean and max over ranks of each rank's typical step, straight from the rank_breakdown view
    sums = ", ".join(f"avg({d}_ns) / 1e6, max({d}_ns) / 1e6" for d in DIMS)
    row = sql_rows(db, f"SELECT {sums} FROM rank_breakdown WHERE run_id = ? AND step IS NULL", name)[0]
    expected = {d: (row[2 * i], row[2 * i + 1]) for i, d in enumerate(DIMS)}
    assert {"COMP", "TOTAL"} <= set(by_dim)
    for dim, (mean, worst) in expected.items():
        if dim in by_dim:
            assert by_dim[dim]["measured_ms"] == pytest.approx(mean, rel=1e-12)
            assert by_dim[dim]["measured_max_ms"] == pytest.approx(worst, rel=1e-12)
        else:  # left out only when nothing was measured (and nothing estimated)
            assert mean == 0
    # estimated: the estimator's own per-stage frame, averaged over stages
    stages = estimate(config.load(cfg_path)).time_frame
    for dim, r in by_dim.items():
        if dim != "OTHER_WAIT":
            column = stages[f"{dim.lower()}_ms"]
            assert r["estimated_ms"] == pytest.approx(column.mean(), rel=1e-12)
            assert r["estimated_max_ms"] == pytest.approx(column.max(), rel=1e-12)
            if r["measured_ms"]:
                assert r["est_over_measured"] == pytest.approx(r["estimated_ms"] / r["measured_ms"], rel=1e-12)
    # per stage: the stage_breakdown view's typical-step rows
    for r in out["by_stage"]:
        mean, worst = sql_rows(db, f"SELECT {r['dim']}_mean_ns / 1e6, {r['dim']}_max_ns / 1e6 FROM stage_breakdown "
                                   "WHERE run_id = ? AND pp = ? AND step IS NULL", name, r["stage"])[0]
        assert (r["measured_ms"], r["measured_max_ms"]) == (pytest.approx(mean, rel=1e-12),
                                                             pytest.approx(worst, rel=1e-12))
    # straggler stage: the stragglers view's flag; predicted: the stage with the largest estimated COMP
    measured_stage = sql_rows(db, "SELECT DISTINCT pp FROM stragglers WHERE run_id = ? AND straggler_stage", name)
    assert out["straggler"]["measured_stage"] == measured_stage[0][0]
    assert out["straggler"]["predicted_stage"] == int(stages["stage"][stages["comp_ms"].arg_max()])
    assert out["straggler"]["agree"] == (out["straggler"]["measured_stage"] == out["straggler"]["predicted_stage"])


def test_every_dimension_of_the_sample_runs_is_compared(db: Path) -> None:
    # The seed-002 experiments exercise TP (tp2dp2, toy8), EP (moe), DP (all) and PP (pp2, toy8): each must reach
    # the sweep's statistics, as the real end-to-end case asks.
    out = compare_json("--estimate", SWEEP, "--db", db)
    quantities = {s["quantity"] for s in out["statistics"]}
    assert {"COMP_ms", "MP_WAIT_ms", "EP_WAIT_ms", "DP_WAIT_ms", "PP_WAIT_ms", "TOTAL_ms"} <= quantities
    rows = pl.DataFrame(out["rows"])
    assert sorted(set(rows["row"])) == sorted(EXPERIMENTS)
    # measured TOTAL of every run = the view's mean over ranks
    for name in EXPERIMENTS:
        total = sql_rows(db, "SELECT avg(TOTAL_ns) / 1e6 FROM rank_breakdown WHERE run_id = ? AND step IS NULL",
                         name)[0][0]
        got = rows.filter((pl.col("row") == name) & (pl.col("quantity") == "TOTAL_ms"))["measured"].item()
        assert got == pytest.approx(total, rel=1e-12)
    # statistics recomputed with numpy from the rows the command printed
    for stat in out["statistics"]:
        part = rows.filter((pl.col("quantity") == stat["quantity"]) & (pl.col("measured") != 0))  # scored rows
        measured, estimated = part["measured"].to_numpy(), part["estimated"].to_numpy()
        assert stat["rows"] == len(measured)
        assert stat["mape_pct"] == pytest.approx(np.mean(np.abs(estimated - measured) / measured) * 100, rel=1e-9)
        if stat["rows"] >= 3 and np.ptp(measured) and np.ptp(estimated):
            assert stat["pearson_r"] == pytest.approx(np.corrcoef(measured, estimated)[0, 1], rel=1e-9)
            ranks = [average_ranks(x) for x in (measured, estimated)]
            assert stat["spearman_rho"] == pytest.approx(np.corrcoef(*ranks)[0, 1], rel=1e-9)
        else:  # fewer than 3 rows, or one side constant (IDLE is estimated 0 for every CPU run): undefined
            assert stat["pearson_r"] is None and stat["spearman_rho"] is None


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Spearman's ranks: ties share the mean of the positions they span."""
    ranks = np.empty(len(values))
    ranks[values.argsort(kind="stable")] = np.arange(len(values))
    for value in np.unique(values):
        ranks[values == value] = ranks[values == value].mean()
    return ranks


def test_several_run_ids_make_a_sweep_with_one_config(db: Path) -> None:
    # the same EP2 x DP4 model, balanced and skewed routing, both estimated as the balanced config
    out = compare_json("--estimate", CONFIGS / "moe_balanced.yaml", "moe_balanced", "moe_skewed", "--db", db)
    totals = {r["row"]: r["measured"] for r in out["rows"] if r["quantity"] == "TOTAL_ms"}
    expected = dict(sql_rows(db, "SELECT run_id, avg(TOTAL_ns) / 1e6 FROM rank_breakdown WHERE step IS NULL AND "
                                 "run_id IN ('moe_balanced', 'moe_skewed') GROUP BY run_id"))
    assert totals == pytest.approx(expected, rel=1e-12)
    estimated = {r["estimated"] for r in out["rows"] if r["quantity"] == "TOTAL_ms"}
    assert len(estimated) == 1  # one config, one estimate


def test_text_output_and_plots(db: Path, tmp_path: Path) -> None:
    single = run_cli("compare", "--estimate", CONFIGS / "pp2_mb8.yaml", "pp2_mb8", "--db", db,
                     "--plot", tmp_path / "run.png")
    assert "per pipeline stage" in single.stdout and "straggler stage" in single.stdout
    sweep = run_cli("compare", "--estimate", SWEEP, "--db", db, "--plot", tmp_path / "sweep.png")
    assert "Pearson r" in sweep.stdout
    for png in ("run.png", "sweep.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_layout_is_compared_per_dimension_only(tmp_path: Path) -> None:
    # pp2_mb8's own groups give its layout now; without them (a trace that states none) no rank has a stage
    data = read_run([SAMPLES / "pp2_mb8"], "kineto", IngestOptions())
    data.layout = None
    data.frames["ranks"] = data.frames["ranks"].with_columns(
        pl.lit(None, pl.Int32).alias(dim) for dim in ("tp", "cp", "ep", "dp", "pp"))
    path = tmp_path / "nolayout.duckdb"
    with store.connect(path) as con:
        store.write_run(con, "pp2_mb8", data)
        result = compare_run(con, "pp2_mb8", estimate(config.load(CONFIGS / "pp2_mb8.yaml")))
    assert result.by_stage is None and result.straggler is None
    assert "--layout" in result.notes[0]
    assert set(result.by_dimension["dim"]) >= {"COMP", "PP_WAIT", "TOTAL"}


def test_trace_memory_per_stage(tmp_path: Path) -> None:
    # Hand-built: ranks 0, 1 in stage 0 peak at 300 and 500 MiB, rank 2 (stage 1) at 100 MiB; rank 3 has no samples.
    mib = 1024**2
    data = run_data([(r, 0, 1000, "compute", None) for r in range(4)], pp={0: 0, 1: 0, 2: 1, 3: 1})
    data.frames["memory"] = pl.DataFrame({"rank": [0, 0, 1, 2], "ts_ns": [1, 2, 1, 1],
                                          "allocated_bytes": [300 * mib, 200 * mib, 500 * mib, 100 * mib]})
    cfg = config.load(CONFIGS / "pp2_mb8.yaml")
    with store.connect(tmp_path / "m.duckdb") as con:
        store.write_run(con, "r", data)
        result = compare_run(con, "r", estimate(cfg))
    memory = result.memory.select("stage", "measured_peak_MiB", "measured_peak_max_MiB").rows()
    assert memory == [(0, 400.0, 500.0), (1, 100.0, 100.0)]  # stage 0: mean of 300 and 500
    assert result.memory["est_over_measured"][1] == pytest.approx(result.memory["estimated_peak_MiB"][1] / 100)


def one_line_error(*args: object) -> str:
    result = run_cli("compare", *args, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_config_contradicting_the_run_is_an_error(db: Path, tmp_path: Path) -> None:
    # world size: a 4-rank config against the 8-rank run
    assert "has 8 ranks" in one_line_error("--estimate", CONFIGS / "moe_skewed.yaml", "toy8_tp2pp2dp2_1f1b",
                                           "--db", db)
    # layout: same world size, TP2 x DP2 config against the EP2 x DP4 run
    assert "parallel.tp=2" in one_line_error("--estimate", CONFIGS / "tp2dp2_mlp.yaml", "moe_skewed", "--db", db)
    # pipeline size: a pp=1, dp=4 config against the 2-stage run
    text = (CONFIGS / "pp2_mb8.yaml").read_text().replace("pp: 2", "pp: 1").replace("dp: 2", "dp: 4")
    (tmp_path / "flat.yaml").write_text(text)
    assert "parallel.pp=1" in one_line_error("--estimate", tmp_path / "flat.yaml", "pp2_mb8", "--db", db)
    # rank order: pp varies fastest in the run (tp-cp-ep-pp-dp), not in this config
    (tmp_path / "order.yaml").write_text((CONFIGS / "pp2_mb8.yaml").read_text().replace(
        "order: tp-cp-ep-pp-dp", "order: tp-cp-ep-dp-pp"))
    assert "parallel.order" in one_line_error("--estimate", tmp_path / "order.yaml", "pp2_mb8", "--db", db)


def test_unknown_runs_are_errors(db: Path, tmp_path: Path) -> None:
    assert "unknown run 'nosuch'" in one_line_error("--estimate", CONFIGS / "pp2_mb8.yaml", "nosuch", "--db", db)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"runs:\n  - {{name: nosuch, config: {CONFIGS / 'pp2_mb8.yaml'}}}\n")
    assert "unknown run 'nosuch'" in one_line_error("--estimate", sweep, "--db", db)
    assert "no entry 'nosuch'" in one_line_error("--estimate", SWEEP, "nosuch", "--db", db)
    assert "not both" in one_line_error("--estimate", CONFIGS / "pp2_mb8.yaml", "pp2_mb8", "--measured", sweep)


def test_the_estimated_step_carries_its_profiles_interval(db: Path, tmp_path: Path) -> None:
    """On a hardware profile with published measured runs (a100: the vTrain set) the step's interval is the
    estimate times exp of the conformal quantiles intervals.json ships, read here from the file, with the measured
    step inside or not; on one without (the CPU sample's own hardware), no interval and the reason."""
    import yaml

    name = "toy8_tp2pp2dp2_1f1b"
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    raw["hardware"] = {"profile": "a100", "devices": 8}
    (tmp_path / "a100.yaml").write_text(yaml.safe_dump(raw))
    step = compare_json("--estimate", tmp_path / "a100.yaml", name, "--db", db)["step"]
    shipped = json.loads((ROOT / "traceana" / "model" / "intervals.json").read_text())["estimate"]["a100"]["0.8"]
    estimated = estimate(config.load(tmp_path / "a100.yaml")).step_s * 1e3
    assert step["estimated_ms"] == pytest.approx(estimated)
    assert step["low"] == pytest.approx(estimated * np.exp(shipped["q_lo"]))
    assert step["high"] == pytest.approx(estimated * np.exp(shipped["q_hi"]))
    (measured,) = sql_rows(db, "SELECT avg(TOTAL_ns) / 1e6 FROM rank_step_breakdown WHERE run_id = ? AND step = ("
                               "SELECT min(step) + 1 FROM rank_step_breakdown WHERE run_id = ?)", name, name)[0]
    assert step["measured_ms"] == pytest.approx(measured, rel=1e-6)
    assert step["inside"] == (step["low"] <= measured <= step["high"])
    plain = compare_json("--estimate", CONFIGS / f"{name}.yaml", name, "--db", db)["step"]
    assert "low" not in plain and plain["interval"].startswith("none: the estimator is unvalidated on")
