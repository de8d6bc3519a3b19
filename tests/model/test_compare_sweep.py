"""`compare --measured CSV`: the shared validation tables and seed 000's peak-memory table as sweeps, checked
against the CSV files read with the standard library and the seed's own ratio column; column rules; bad CSVs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, SHARED, run_cli
from tests.model.test_compare import one_line_error
from traceana.estimator import config
from traceana.model.sweep import PEAK, quantity, read_csv

VALIDATION = SHARED / "validation"
KORTHIKANTI = (ROOT / "examples" / "korthikanti2022_gpt.yaml", VALIDATION / "korthikanti2022_table5.csv")
VTRAIN = (ROOT / "examples" / "vtrain_single_node.yaml", VALIDATION / "vtrain_ground_truth_single_node.csv")
SEED000 = (ROOT / "examples" / "seed000_deepseek_v3_reduced.yaml", ROOT / "examples" / "seed000_peak_memory.csv")


def sweep_json(cfg: Path, measured: Path) -> dict:
    return json.loads(run_cli("compare", "--estimate", cfg, "--measured", measured, "--json").stdout)


@pytest.mark.parametrize(("files", "column", "to_ms"), [(KORTHIKANTI, "measured_iteration_s", 1e3),
                                                        (VTRAIN, "iteration time (ms)", 1.0)])
def test_validation_tables_run_as_measured_sweeps(files: tuple[Path, Path], column: str, to_ms: float) -> None:
    cfg, table = files
    with table.open(encoding="utf-8-sig", newline="") as f:
        expected = [float(r[column]) * to_ms for r in csv.DictReader(f)]
    out = sweep_json(cfg, table)
    measured = np.array([r["measured"] for r in out["rows"]])
    estimated = np.array([r["estimated"] for r in out["rows"]])
    assert [r["quantity"] for r in out["rows"]] == ["TOTAL_ms"] * len(expected)
    assert measured.tolist() == pytest.approx(expected, rel=1e-12)
    (stat,) = out["statistics"]
    assert stat["rows"] == len(expected)
    assert stat["pearson_r"] == pytest.approx(np.corrcoef(measured, estimated)[0, 1], rel=1e-9)
    assert stat["mape_pct"] == pytest.approx(100 * np.mean(np.abs(estimated / measured - 1)), rel=1e-9)
    worst = int(np.argmax(np.abs(estimated / measured - 1)))
    assert stat["worst_row"] == out["rows"][worst]["row"]


def test_seed000_peak_memory_reproduces_its_ratios() -> None:
    # The seed's 预估/实测 column, which examples/seed000_peak_memory.csv leaves out: the command must recompute it
    # from the two peak columns (seed 000 section 1: A 0.75, B 0.73, C 0.72, D 1.06, E 1.05, F 1.06).
    seed_ratios = {"A": 0.75, "B": 0.73, "C": 0.72, "D": 1.06, "E": 1.05, "F": 1.06}
    out = sweep_json(*SEED000)
    got = {r["row"].split()[1]: round(r["reference_over_measured"], 2) for r in out["rows"]}
    assert got == seed_ratios
    assert {r["quantity"] for r in out["rows"]} == {PEAK}
    assert {s["estimator"] for s in out["statistics"]} == {"traceana", "reference"}
    # traceana's own estimate of each config is there too: EP and TP change its peak as the rows say
    ours = {r["row"].split()[1]: r["estimated"] for r in out["rows"]}
    assert ours["A"] > ours["B"] > ours["C"] and ours["A"] > ours["E"]


def test_csv_columns_override_the_base_config() -> None:
    rows, notes = read_csv(KORTHIKANTI[1], config.load(KORTHIKANTI[0]))
    assert notes == ["korthikanti2022_table5.csv: ignored columns: params_b, gpu"]
    row3, row4 = rows[2].config, rows[3].config  # 175B, full recompute / sequence parallel + selective
    assert (row3.model.hidden, row3.model.ffn_hidden, row3.model.layers, row3.model.heads) == (12288, 49152, 96, 96)
    assert (row3.parallel.tp, row3.parallel.pp, row3.parallel.vpp, row3.schedule.kind) == (8, 8, 3, "interleaved")
    assert (row3.parallel.sequence_parallel, row3.schedule.recompute.kind) == (False, "full")
    assert (row4.parallel.sequence_parallel, row4.schedule.recompute.kind) == (True, "selective")
    assert rows[6].config.schedule.kind == "1f1b"  # 1T: virtual_stages 1
    assert rows[0].label == "1 22B" and rows[0].measured == {"TOTAL_ms": pytest.approx(1420.0)}


@pytest.mark.parametrize(("name", "expected"), [
    ("iteration time (ms)", ("TOTAL_ms", 1.0, False)), ("measured_iteration_s", ("TOTAL_ms", 1e3, False)),
    ("COMP_us", ("COMP_ms", 1e-3, False)), ("PP_WAIT_ns", ("PP_WAIT_ms", 1e-6, False)),
    ("measured_peak_mib", (PEAK, 1.0, False)), ("estimated_peak_gib", (PEAK, 1024.0, True)),
    ("Peak HBM (bytes)", (PEAK, 1 / 1024**2, False)), ("params_b", None), ("tp", None), ("total", None),
])
def test_measured_column_names(name: str, expected: tuple | None) -> None:
    assert quantity(name) == expected


def test_bad_csvs_are_one_line_errors(tmp_path: Path) -> None:
    cfg = KORTHIKANTI[0]
    cases = {
        "tp,pp,dp\n8,1,1\n": "no measured column",
        "tp,pp,dp,TOTAL_ms\n8,1,1,5\n,1,1,6\n": "row 2: column 'tp' is empty",
        "tp,pp,dp,TOTAL_ms\n8,1,1,5\n3,1,1,6\n": "row 2: parallel.tp=3 does not divide model.heads",
        "tp,pp,dp,gpus,TOTAL_ms\n8,1,1,16,5\n": "hardware.devices=16",
        "tp,pp,dp,sequence_parallel,TOTAL_ms\n8,1,1,maybe,5\n": "parallel.sequence_parallel='maybe'",
        "tp,pp,dp,TOTAL_ms\n": "no data rows",
        "tp,pp,dp,TOTAL_ms\n8,1,1,fast\n": "column 'TOTAL_ms' must hold numbers",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.csv"
        path.write_text(text)
        line = one_line_error("--estimate", cfg, "--measured", path)
        assert message in line and path.name in line, line
    assert "cannot read" in one_line_error("--estimate", cfg, "--measured", tmp_path / "missing.csv")


def test_inline_measured_runs(tmp_path: Path) -> None:
    # runs: entries carrying their own measured values need no store; an unknown key is an error
    sweep = tmp_path / "sweep.yaml"
    base = KORTHIKANTI[0].read_text()
    sweep.write_text(base + "runs:\n  - {name: a, measured: {iteration_time_s: 1.42}}\n"
                            "  - {name: b, parallel: {micro_batch: 2, global_batch: 4}, measured: {TOTAL_ms: 1500}}\n")
    out = json.loads(run_cli("compare", "--estimate", sweep, "--json", "--db", tmp_path / "none.duckdb").stdout)
    assert [(r["row"], r["measured"]) for r in out["rows"]] == [("a", pytest.approx(1420.0)), ("b", 1500.0)]
    sweep.write_text(base + "runs:\n  - {name: a, measured: {iteration_hours: 1}}\n")
    assert "measured.iteration_hours: not a measured quantity" in one_line_error("--estimate", sweep)
    sweep.write_text(base + "runs:\n  - {name: a, measured: {TOTAL_ms: slow}}\n")
    assert "measured.TOTAL_ms='slow': expected a number" in one_line_error("--estimate", sweep)
