"""`traceana estimate` and `traceana search` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[2]
M3 = ROOT / "examples" / "m3_512_h100.yaml"
SMALL = ROOT / "examples" / "vtrain_calibrated.yaml"


def test_estimate_prints_tables_and_a_summary(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("estimate", M3)
    assert "time per stage (ms)" in result.stdout and "memory per stage (GiB)" in result.stdout
    assert "MFU" in result.stdout and "tokens/s" in result.stdout


def test_estimate_json_columns_sum_to_the_step(cli) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(cli("estimate", M3, "--json").stdout)
    assert len(out["stages"]) == 4 and len(out["memory"]) == 4
    for row in out["stages"]:
        parts = sum(row[f"{d}_ms"] for d in ("comp", "mp_wait", "cp_wait", "ep_wait", "dp_wait", "pp_wait", "idle"))
        assert abs(parts - row["total_ms"]) < 1e-6 * row["total_ms"]
        assert abs(row["total_ms"] - out["step_ms"]) < 1e-9 * out["step_ms"]
    assert out["fits"] == all(m["fits"] for m in out["memory"])
    assert 0 < out["mfu"] < 1


def test_estimate_writes_the_store_idempotently(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "t.duckdb"
    cli("estimate", M3, "--db", db)
    cli("estimate", M3, "--db", db)  # the same id again replaces, never duplicates
    cli("estimate", SMALL, "--db", db, "--estimate-id", "small")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT estimate_id FROM estimate_runs ORDER BY 1").fetchall() == [("m3_512_h100",),
                                                                                              ("small",)]
        rows = con.execute("SELECT count(*), count(*) FILTER (WHERE comp_ns + mp_wait_ns + cp_wait_ns + ep_wait_ns "
                           "+ dp_wait_ns + pp_wait_ns + idle_ns = total_ns) FROM estimate_stages").fetchone()
        assert rows == (6, 6)
        step, layout = con.execute("SELECT step_ns, layout FROM estimate_runs WHERE estimate_id = 'm3_512_h100'"
                                   ).fetchone()
        stage_totals = {r[0] for r in con.execute("SELECT total_ns FROM estimate_stages WHERE estimate_id = "
                                                  "'m3_512_h100'").fetchall()}
    assert stage_totals == {step}
    assert layout == "tp=4,cp=1,ep=8,dp=32,pp=4,order=tp-cp-ep-dp-pp"


def test_estimate_plot_and_trace(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    png, trace = tmp_path / "gantt.png", tmp_path / "step.json"
    result = cli("estimate", M3, "--plot", png, "--trace", trace)
    assert f"wrote {png}\nwrote {trace}\n" in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert {e["tid"] for e in slices if e["cat"] == "F"} == {0, 1, 2, 3}


def test_search_ranks_fitting_layouts(cli) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(cli("search", SMALL, "--top", "5", "--json").stdout)
    top = out["top"]
    assert len(top) == 5 and out["candidates"] >= out["fitting"] >= out["simulated"] >= 5
    steps = [r["step_ms"] for r in top]
    assert steps == sorted(steps)
    assert all(r["tp"] * r["cp"] * r["pp"] * r["dp"] == 8 and r["peak_gib"] <= 80 for r in top)
    assert "fastest of" in cli("search", SMALL, "--top", "2").stdout


def test_search_rejects_a_bad_top(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("search", SMALL, "--top", "0", check=False)
    assert result.returncode == 2 and result.stderr.strip() == "error: --top 0: must be at least 1"


def test_an_error_names_the_config_path_as_written(tmp_path: Path) -> None:
    # String fields are read case-insensitively; the path in the messages went through the same lower() and
    # `--estimate .../h200_gpt_h2048_L8.yaml` was named "h200_gpt_h2048_l8.yaml".
    from tests.conftest import one_line, run_main

    config = tmp_path / "Job_H2048_L8.yaml"
    config.write_text((ROOT / "examples" / "h200_gpt_h2048_L8.yaml").read_text().replace("layers: 8,", "layers: -8,"))
    code, _, err = run_main("estimate", config)
    line = one_line(code, err)
    assert line.startswith(f"error: {config}: model.layers"), line
