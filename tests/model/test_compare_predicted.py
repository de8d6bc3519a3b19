"""`compare --predicted FILE`: another estimator's predictions for the sample runs (real gloo CPU traces), checked
by second routes — r and MAPE per dim by hand from the file and `breakdown --json` of each run, and the same numbers
through `compare --estimate` when the file holds traceana's own estimate — stored in the estimate tables, read as
CSV, JSON and Parquet; seed 000's diagnosis on its own peak-memory table; every bad input one line, exit 2, the
store unchanged."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import traceana
from tests.conftest import ROOT, run_cli
from tests.model.test_compare import CONFIGS, SWEEP, average_ranks, one_line_error, sample_store, sql_rows
from tests.test_sample_traces import EXPERIMENTS
from traceana.estimator import record

EXAMPLE = ROOT / "examples" / "sample_traces_predictions.csv"
TIMES = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "IDLE", "TOTAL")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_store(tmp_path_factory.mktemp("predicted") / "samples.duckdb")


def predicted_json(*args: object) -> dict:
    return json.loads(run_cli("compare", "--predicted", *args, "--json").stdout)


def file_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_example_file_scores_as_a_hand_computation_from_the_file_and_breakdown_json(db: Path) -> None:
    # Route 2: the file read with the csv module (each run's estimate = mean over its stages) against each run's
    # `traceana breakdown RUN --json` (the typical step per rank; the run = mean over ranks).
    estimated: dict[str, dict[str, float]] = {}
    for row in file_rows(EXAMPLE):
        estimated.setdefault(row["run"], {}).setdefault("n", 0)
        estimated[row["run"]]["n"] += 1
        for dim in TIMES:
            estimated[row["run"]][dim] = estimated[row["run"]].get(dim, 0.0) + float(row[f"{dim}_ms"])
    assert set(estimated) == set(EXPERIMENTS)
    measured = {}
    for run in estimated:
        ranks = json.loads(run_cli("breakdown", run, "--json", "--db", db).stdout)
        measured[run] = {d: np.mean([r[f"{d}_ms"] for r in ranks]) for d in TIMES}
    out = predicted_json(EXAMPLE, "--db", db)
    stats = {s["quantity"]: s for s in out["statistics"]}
    assert {"COMP_ms", "MP_WAIT_ms", "EP_WAIT_ms", "DP_WAIT_ms", "PP_WAIT_ms", "TOTAL_ms"} <= set(stats)
    assert {s["estimator"] for s in out["statistics"]} == {"predicted"}
    for dim in TIMES:
        runs = [r for r in estimated if measured[r][dim] != 0]  # error % needs a measured value
        if not runs:  # CP: no sample run has context parallelism
            assert f"{dim}_ms" not in stats
            continue
        m = np.array([measured[r][dim] for r in runs])
        e = np.array([estimated[r][dim] / estimated[r]["n"] for r in runs])
        stat = stats[f"{dim}_ms"]
        assert stat["rows"] == len(runs)
        assert stat["mape_pct"] == pytest.approx(100 * np.mean(np.abs(e - m) / m), rel=1e-9)
        if len(runs) >= 3 and np.ptp(e):
            assert stat["pearson_r"] == pytest.approx(np.corrcoef(m, e)[0, 1], rel=1e-9)
            ranks = [average_ranks(x) for x in (m, e)]
            assert stat["spearman_rho"] == pytest.approx(np.corrcoef(*ranks)[0, 1], rel=1e-9)
        else:  # two EP runs; IDLE predicted 0 everywhere: undefined
            assert stat["pearson_r"] is None
    # the per-row table holds the same measured and estimated numbers
    got = {(r["row"], r["quantity"]): (r["measured"], r["estimated"]) for r in out["rows"]}
    for (run, quantity), (m_ms, e_ms) in got.items():
        if quantity != "peak_memory_MiB":
            dim = quantity.removesuffix("_ms")
            assert (m_ms, e_ms) == pytest.approx((measured[run][dim], estimated[run][dim] / estimated[run]["n"]),
                                                 rel=1e-9)


def traceana_predictions(path: Path) -> Path:
    """Route 3: traceana's own `estimate --json` of each sample config, written in the predictions schema at full
    precision (peak as MiB)."""
    rows = []
    for run in EXPERIMENTS:
        out = json.loads(run_cli("estimate", CONFIGS / f"{run}.yaml", "--json").stdout)
        for stage, memory in zip(out["stages"], out["memory"], strict=True):
            rows.append({"run": run, "stage": stage["stage"],
                         **{f"{d}_ms": repr(stage[f"{d.lower()}_ms"]) for d in TIMES},
                         "peak_memory_mib": repr(memory["peak_gib"] * 1024)})
    return write_csv(path, rows)


def test_traceana_estimate_as_a_file_compares_as_compare_estimate_does(db: Path, tmp_path: Path) -> None:
    preds = traceana_predictions(tmp_path / "ours.csv")
    for run in ("toy8_tp2pp2dp2_1f1b", "moe_skewed"):
        a = predicted_json(preds, run, "--db", db)
        b = json.loads(run_cli("compare", "--estimate", CONFIGS / f"{run}.yaml", run, "--db", db, "--json").stdout)
        assert a["predicted"] == str(preds) and a["notes"] == []
        for key in ("by_dimension", "by_stage", "straggler", "memory", "diagnosis"):
            assert _close(a[key], b[key]), key
    sweep_a = predicted_json(preds, "--db", db)
    sweep_b = json.loads(run_cli("compare", "--estimate", SWEEP, "--db", db, "--json").stdout)
    assert _close(sweep_a["rows"], sweep_b["rows"])
    assert _close([{k: v for k, v in s.items() if k != "estimator"} for s in sweep_a["statistics"]],
                  [{k: v for k, v in s.items() if k != "estimator"} for s in sweep_b["statistics"]])


def _close(a: object, b: object) -> bool:
    """Equal, floats to 1e-9 relative (the file's decimal text of each float)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-12)
    return a == b


def test_predictions_are_stored_as_estimates(db: Path) -> None:
    predicted_json(EXAMPLE, "pp2_mb8", "--db", db)
    predicted_json(EXAMPLE, "pp2_mb8", "--db", db)  # again: replaced, not added
    runs = sql_rows(db, "SELECT config_path, world_size, layout, schedule, micro_batches, step_ns, fits, config_json "
                        "FROM estimate_runs WHERE estimate_id = 'sample_traces_predictions:pp2_mb8'")
    layout = sql_rows(db, "SELECT layout FROM runs WHERE run_id = 'pp2_mb8'")[0][0]
    rows = [r for r in file_rows(EXAMPLE) if r["run"] == "pp2_mb8"]
    assert runs == [(str(EXAMPLE), 4, layout, None, None, round(float(rows[0]["TOTAL_ms"]) * 1e6), None, None)]
    stages = sql_rows(db, "SELECT stage, comp_ns, pp_wait_ns, idle_ns, total_ns, peak_bytes, layers FROM "
                          "estimate_stages WHERE estimate_id = 'sample_traces_predictions:pp2_mb8' ORDER BY stage")
    assert stages == [(int(r["stage"]), *(round(float(r[f"{d}_ms"]) * 1e6) for d in ("COMP", "PP_WAIT", "IDLE",
                                                                                        "TOTAL")),
                       round(float(r["peak_memory_mb"]) * 1e6), None) for r in rows]


def test_json_and_parquet_files_read_as_the_csv(db: Path, tmp_path: Path) -> None:
    frame = pl.read_csv(EXAMPLE, comment_prefix="#")
    frame.write_parquet(tmp_path / "p.parquet")
    (tmp_path / "p.json").write_text(json.dumps(frame.to_dicts()))
    (tmp_path / "rows.json").write_text(json.dumps({"rows": frame.to_dicts()}))
    expected = predicted_json(EXAMPLE, "--db", db)
    for name in ("p.parquet", "p.json", "rows.json"):
        got = predicted_json(tmp_path / name, "--db", db)
        assert got["rows"] == expected["rows"] and got["statistics"] == expected["statistics"], name


def test_missing_columns_are_noted_and_not_compared(db: Path, tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k not in ("PP_WAIT_ms", "TOTAL_ms", "peak_memory_mb")}
            for r in file_rows(EXAMPLE)]
    out = predicted_json(write_csv(tmp_path / "parts.csv", rows), "--db", db)
    assert out["notes"] == ["no PP_WAIT_ms, TOTAL_ms, peak_memory_mb in parts.csv: PP_WAIT, TOTAL, peak memory "
                            "not compared (not derived from the parts)"]
    quantities = {s["quantity"] for s in out["statistics"]}
    assert "COMP_ms" in quantities and not quantities & {"PP_WAIT_ms", "TOTAL_ms", "peak_memory_MiB"}
    one = predicted_json(tmp_path / "parts.csv", "pp2_mb8", "--db", db)
    dims = {r["dim"]: r for r in one["by_dimension"]}
    assert dims["PP_WAIT"]["estimated_ms"] is None and dims["PP_WAIT"]["measured_ms"] > 0  # shown, not scored
    assert dims["COMP"]["estimated_ms"] is not None and one["notes"] == out["notes"]
    # a whole-run row (no stage) for a one-stage run, TOTAL only
    only = write_csv(tmp_path / "total.csv", [{"run": "moe_skewed", "TOTAL_ms": 64.5}])
    one = predicted_json(only, "--db", db)
    assert [r["dim"] for r in one["by_dimension"] if r["estimated_ms"] is not None] == ["TOTAL"]
    assert one["straggler"] is None and one["by_stage"][0]["stage"] == 0


def test_parts_over_total_and_units_are_diagnosed(db: Path, tmp_path: Path) -> None:
    rows = file_rows(EXAMPLE)
    # TOTAL written in µs: every run's TOTAL 1000x
    micro = [{**r, "TOTAL_ms": float(r["TOTAL_ms"]) * 1000} for r in rows]
    out = predicted_json(write_csv(tmp_path / "us.csv", micro), "--db", db)
    (units,) = [d for d in out["diagnosis"] if d["kind"] == "units"]
    assert units["quantity"] == "TOTAL_ms" and "looks like µs" in units["finding"]
    # COMP in seconds: 1/1000; a part > TOTAL is counted in a note
    seconds = [{**r, "COMP_ms": float(r["COMP_ms"]) / 1000} for r in rows]
    out = predicted_json(write_csv(tmp_path / "s.csv", seconds), "--db", db)
    assert [d["quantity"] for d in out["diagnosis"] if "looks like seconds" in d["finding"]] == ["COMP_ms"]
    bigger = [{**r, "DP_WAIT_ms": float(r["TOTAL_ms"])} if r["run"] == "pp2_mb1" else r for r in rows]
    out = predicted_json(write_csv(tmp_path / "over.csv", bigger), "--db", db)
    assert any("in 2 of 10 rows the parts" in n and "row 3, run pp2_mb1 stage 0" in n for n in out["notes"])


def test_rank_order_inversion_is_diagnosed(db: Path, tmp_path: Path) -> None:
    # the example's TOTALs handed out in the reverse order of the measured TOTALs: Pearson and Spearman negative
    measured = {r["row"]: r["measured"] for r in predicted_json(EXAMPLE, "--db", db)["rows"]
                if r["quantity"] == "TOTAL_ms"}
    order = sorted(measured, key=measured.get)
    totals = dict(zip(order, sorted((measured[r] for r in order), reverse=True), strict=True))
    rows = [{"run": run, "TOTAL_ms": totals[run]} for run in ("tp2dp2_mlp", "tp2dp2_mlp_sp", "moe_balanced",
                                                               "moe_skewed")]
    out = predicted_json(write_csv(tmp_path / "inverted.csv", rows), "--db", db)
    (finding,) = [d for d in out["diagnosis"] if d["kind"] == "rank order"]
    stat = next(s for s in out["statistics"] if s["quantity"] == "TOTAL_ms")
    assert finding["quantity"] == "TOTAL_ms" and stat["pearson_r"] < 0 and stat["spearman_rho"] == pytest.approx(-1)
    assert f"Pearson r {stat['pearson_r']:.3f}" in finding["finding"]


def test_seed000_tp_dependent_memory_bias_is_diagnosed() -> None:
    # Seed 000's own table (examples/seed000_peak_memory.csv): SAPP-ND's peak is 0.72-0.75x at TP 1 and
    # 1.05-1.06x at TP 2 (P1). dp varies with tp there (32 devices), so it is named beside it.
    out = json.loads(run_cli("compare", "--estimate", ROOT / "examples" / "seed000_deepseek_v3_reduced.yaml",
                             "--measured", ROOT / "examples" / "seed000_peak_memory.csv", "--json").stdout)
    (p1,) = [d for d in out["diagnosis"] if d["estimator"] == "reference"]
    with (ROOT / "examples" / "seed000_peak_memory.csv").open() as f:
        table = list(csv.DictReader(line for line in f if not line.startswith("#")))
    by_tp = {tp: np.mean([100 * (float(r["estimated_peak_mib"]) / float(r["measured_peak_mib"]) - 1)
                          for r in table if r["tp"] == tp]) for tp in ("1", "2")}
    assert p1["kind"] == "size bias" and p1["quantity"] == "peak_memory_MiB"
    assert "depends on tp" in p1["finding"] and "so does dp" in p1["finding"]
    assert f"tp=1: {by_tp['1']:+.1f}%, tp=2: {by_tp['2']:+.1f}%" in p1["finding"]


def test_api_compare_predicted(db: Path) -> None:
    frame = traceana.open(db).compare(predicted=EXAMPLE, run="pp2_mb8")
    cli = predicted_json(EXAMPLE, "pp2_mb8", "--db", db)["by_dimension"]
    assert frame.to_dicts() == cli


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


BAD = {  # name: (header, rows, what the one line must say)
    "unknown column": (["run", "stage", "TOTAL_ms", "flops"], [["pp2_mb8", 0, 1, 2]], "column 'flops': not a"),
    "another unit": (["run", "COMP_us"], [["moe_skewed", 5]], "column 'COMP_us': times are in ms"),
    "no run": (["stage", "TOTAL_ms"], [[0, 1]], "no run column"),
    "unknown run": (["run", "TOTAL_ms"], [["moe_skewed", 1], ["nosuch", 2]], "row 2, column run: 'nosuch' is not"),
    "negative": (["run", "stage", "PP_WAIT_ms"], [["pp2_mb8", 0, 1], ["pp2_mb8", 1, -3]],
                 "row 2, column PP_WAIT_ms: -3.0 is negative"),
    "nan": (["run", "TOTAL_ms"], [["moe_skewed", "NaN"]], "row 1, column TOTAL_ms: nan is NaN"),
    "text": (["run", "TOTAL_ms"], [["moe_skewed", 3], ["moe_balanced", "fast"]],
             "row 2, column TOTAL_ms: 'fast' is not a number"),
    "empty": (["run", "COMP_ms", "TOTAL_ms"], [["moe_skewed", 1, 3], ["moe_balanced", "", 4]],
              "row 2, column COMP_ms: empty"),
    "stage the run lacks": (["run", "stage", "TOTAL_ms"], [["pp2_mb8", 0, 1], ["pp2_mb8", 1, 1], ["pp2_mb8", 2, 1]],
                            "row 3, column stage: 2 is a stage the run lacks"),
    "stage twice": (["run", "stage", "TOTAL_ms"], [["pp2_mb8", 0, 1], ["pp2_mb8", 0, 1]],
                    "row 2, column stage: 0 is given twice"),
    "some stages": (["run", "stage", "TOTAL_ms"], [["pp2_mb8", 1, 1]],
                    "row 1, column stage: run 'pp2_mb8' has 2 pipeline stages, the file gives 1"),
    "whole run of two stages": (["run", "TOTAL_ms"], [["pp2_mb8", 1]],
                                "row 1, column stage: empty, but run 'pp2_mb8' has 2 pipeline stages"),
    "fractional stage": (["run", "stage", "TOTAL_ms"], [["moe_skewed", 0.5, 1]], "row 1, column stage: 0.5 is not"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_predictions_are_one_line_and_leave_the_store_alone(db: Path, tmp_path: Path, case: str) -> None:
    header, rows, says = BAD[case]
    path = tmp_path / "bad.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    before = digest(db)
    line = one_line_error("--predicted", path, "--db", db)
    assert says in line and str(path) in line, line
    assert digest(db) == before


def test_bad_arguments(db: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("run,TOTAL_ms\nmoe_skewed,1\n")
    assert "csv, .json or .parquet" in one_line_error("--predicted", tmp_path / "p.txt", "--db", db)
    assert "one of them" in one_line_error("--predicted", EXAMPLE, "--estimate", SWEEP, "--db", db)
    assert "one of them" in one_line_error("--db", db)
    assert "--fit go with --estimate" in one_line_error("--predicted", EXAMPLE, "--fit", "--db", db)
    assert "no row for run 'tp2dp2'" in one_line_error("--predicted", EXAMPLE, "tp2dp2", "--db", db)
    (tmp_path / "bad.json").write_text('{"run": "moe_skewed"}')
    assert "JSON array of objects" in one_line_error("--predicted", tmp_path / "bad.json", "--db", db)


def test_a_store_whose_estimate_columns_are_not_null_takes_predictions(db: Path, tmp_path: Path) -> None:
    # Stores written before predictions existed declared every estimate column NOT NULL (an estimate --db there)
    old = shutil.copy(db, tmp_path / "old.duckdb")
    run_cli("estimate", CONFIGS / "pp2_mb8.yaml", "--db", old)
    with duckdb.connect(str(old)) as con:
        for table in record.NULLABLE:  # only the estimate an older store could hold
            con.execute(f"DELETE FROM {table} WHERE estimate_id <> 'pp2_mb8'")
        for table, columns in record.NULLABLE.items():
            for column in columns:
                con.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET NOT NULL")
    predicted_json(EXAMPLE, "pp2_mb8", "--db", old)
    assert sql_rows(old, "SELECT estimate_id, fits FROM estimate_runs ORDER BY 1") == [
        ("pp2_mb8", True), ("sample_traces_predictions:pp2_mb8", None)]


def test_text_output_and_plots(db: Path, tmp_path: Path) -> None:
    sweep = run_cli("compare", "--predicted", EXAMPLE, "--db", db, "--plot", tmp_path / "sweep.png")
    assert "Pearson r" in sweep.stdout and "predicted DP_WAIT_ms, size bias: error depends on dp" in sweep.stdout
    assert "stored 7 estimate(s) sample_traces_predictions:RUN" in sweep.stderr
    one = run_cli("compare", "--predicted", EXAMPLE, "pp2_mb8", "--db", db, "--plot", tmp_path / "run.png")
    assert "pp2_mb8 vs sample_traces_predictions.csv" in one.stdout and "straggler stage" in one.stdout
    for png in ("run.png", "sweep.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
