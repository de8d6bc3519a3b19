"""`diff`: two pipeline samples and two MoE samples with numbers from the sample programs, and two shared H200
Kineto traces whose new and vanished kernels are read from their raw JSON."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.analyses.test_kernels import short
from tests.conftest import SAMPLES, TRACES, add_run
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses.breakdown import PARTS
from traceana.analyses.diff import breakdown_diff, collective_diff, kernel_diff
from traceana.cli.main import app
from traceana.render import console

H200 = {"gpt": TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz",
        "hostbound": TRACES / "kineto" / "h200_hostbound_h512_L12_s256_gb8.json.gz"}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diff")
    with store.connect(folder / "t.duckdb") as con:
        for name in ("pp2_mb1", "pp2_mb8", "moe_balanced", "moe_skewed"):
            add_run(con, name, [SAMPLES / name], "kineto", EXPERIMENTS[name][0])
        for name, path in H200.items():
            add_run(con, name, [path], "kineto")
        for name in ("torch_npu_2rank_level1", "torch_npu_2rank_level1_db"):
            add_run(con, name, [TRACES / "ascend" / name], "ascend")
    return folder / "t.duckdb"


@pytest.fixture
def con(db: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with store.connect(db, read_only=True) as connection:
        yield connection


def _by(frame, *keys: str) -> dict:
    return {tuple(r[k] for k in keys): r for r in frame.iter_rows(named=True)}


def test_pipeline_micro_batches(con: duckdb.DuckDBPyConnection) -> None:
    # sample_traces/pipeline.py: 64 samples per step as 1 or 8 micro-batches, each one Send and one Recv of
    # [mb, 1024] fp32 per rank: the same 262144 bytes per rank and step in 1 or 8 messages. The DP all-reduce
    # carries one stage's weight gradient, [1024, 512] or [512, 1024] fp32 = 2097152 bytes, once per step.
    comms = _by(collective_diff(con, "pp2_mb1", "pp2_mb8"), "op", "dim")
    for op in ("Send", "Recv"):
        row = comms[op, "PP"]
        assert (row["calls_A"], row["calls_B"], row["bytes_A"], row["bytes_B"]) == (1, 8, 262144, 262144)
    assert (comms["AllReduce", "DP"]["bytes_A"], comms["AllReduce", "DP"]["calls_delta"]) == (2097152, 0)
    # aten::mm per rank and step: stage 0 one (W0's gradient), stage 1 two (dH and W1's gradient), per micro-batch
    mm = _by(kernel_diff(con, "pp2_mb1", "pp2_mb8"), "short_name")[("aten::mm",)]
    assert (mm["calls_A"], mm["calls_B"], mm["status"]) == (1.5, 12, "both")
    # the measured PP_WAIT rise (tests/analyses/test_breakdown_real.py) shows on both stages
    parts = _by(breakdown_diff(con, "pp2_mb1", "pp2_mb8"), "stage", "part")
    assert all(parts[stage, "PP_WAIT"]["ms_delta"] > 0 for stage in (0, 1))


def test_moe_skew_keeps_traffic_and_the_parts_explain_the_total(con: duckdb.DuckDBPyConnection) -> None:
    # sample_traces/moe.py: 4 all-to-alls per rank and step (dispatch and combine, forward and backward); ranks send
    # 64 tokens x 512 fp32 (balanced), or 112 and 16 tokens (skewed): the same mean, 4 x 131072 bytes. The DP-EP
    # all-reduce carries the expert's two [512, 2048] fp32 weight gradients: 8388608 bytes.
    comms = _by(collective_diff(con, "moe_balanced", "moe_skewed"), "op", "dim")
    a2a = comms["AllToAll", "EP"]
    assert (a2a["calls_A"], a2a["calls_B"], a2a["bytes_A"], a2a["bytes_B"]) == (4, 4, 524288, 524288)
    assert comms["AllReduce", "DP-EP"]["bytes_B"] == 8388608
    # the parts' changes add up to TOTAL's; here TOTAL moved 1.08 ms while EP_WAIT rose 2.30 and DP_WAIT fell 2.57
    # (breakdown_diff's own numbers), so no part's share of TOTAL's change is given: they offset each other
    parts = breakdown_diff(con, "moe_balanced", "moe_skewed")
    deltas = {r["part"]: r["ms_delta"] for r in parts.iter_rows(named=True)}
    assert sum(deltas[p] for p in PARTS) == pytest.approx(deltas["TOTAL"], abs=1e-9)
    assert abs(deltas["TOTAL"]) < max(abs(deltas[p]) for p in PARTS)
    assert parts["explains_pct"].is_null().all()


def test_shares_of_the_total_change_where_no_part_outgrew_it(con: duckdb.DuckDBPyConnection) -> None:
    # 1 -> 8 micro-batches: both stages' TOTAL rose by more than any part did, so each part's share is given and
    # the shares add up to 100%
    parts = breakdown_diff(con, "pp2_mb1", "pp2_mb8")
    for stage in (0, 1):
        rows = parts.filter((parts["stage"] == stage) & parts["part"].is_in(PARTS))
        total = parts.filter((parts["stage"] == stage) & (parts["part"] == "TOTAL"))["ms_delta"][0]
        assert abs(total) >= rows["ms_delta"].abs().max()
        assert rows["explains_pct"].sum() == pytest.approx(100, abs=1e-6)
        assert rows["explains_pct"].to_list() == pytest.approx((100 * rows["ms_delta"] / total).to_list())


def _raw_short_names(path: Path, windows: list[tuple[int, int]]) -> set[str]:
    with gzip.open(path) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    return {short(e["name"]) for e in raw["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and any(w0 <= base + round(e["ts"] * 1000) < w1 for w0, w1 in windows)}


def test_new_and_vanished_kernels_against_the_json(con: duckdb.DuckDBPyConnection) -> None:
    names = {run: _raw_short_names(path, con.execute("SELECT start_ns, end_ns FROM step_windows WHERE run_id = ?",
                                                     [run]).fetchall()) for run, path in H200.items()}
    kernels = kernel_diff(con, "gpt", "hostbound")
    status = {s: set(kernels.filter(kernels["status"] == s)["short_name"]) for s in ("new", "vanished", "both")}
    assert status["new"] == names["hostbound"] - names["gpt"] and status["new"]
    assert status["vanished"] == names["gpt"] - names["hostbound"] and status["vanished"]
    assert status["both"] == names["gpt"] & names["hostbound"]


def test_one_program_in_two_export_formats(con: duckdb.DuckDBPyConnection) -> None:
    # ../shared/traces/README.md: the Ascend text export and the database export record the same kind of 2-rank
    # run (one program): the same kernels and collectives, as often, with the same bytes; only times differ.
    kernels = kernel_diff(con, "torch_npu_2rank_level1_db", "torch_npu_2rank_level1")
    assert set(kernels["status"]) == {"both"} and kernels["calls_delta"].abs().max() == 0
    comms = collective_diff(con, "torch_npu_2rank_level1_db", "torch_npu_2rank_level1")
    assert comms.select("op", "calls_A", "calls_delta", "bytes_delta").rows() == [("AllReduce", 4, 0, 0)]
    total = _by(breakdown_diff(con, "torch_npu_2rank_level1_db", "torch_npu_2rank_level1"), "part")[("TOTAL",)]
    assert abs(total["ms_delta_pct"]) < 10


def test_command(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["diff", "pp2_mb1", "pp2_mb8", "--db", str(db), "--json", "--top", "2"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert len(payload["kernels_changed"]) == 2 and payload["kernels_changed"][0]["short_name"] == "gloo:send"
    # the table: calls per rank-step print as integers where whole ("1" beside "8", not "1.000"), bytes in MiB
    monkeypatch.setattr(console, "console", Console(width=250, color_system=None))  # xdist's COLUMNS is 80
    result = runner.invoke(app, ["diff", "pp2_mb1", "pp2_mb8", "--db", str(db)])
    assert result.exit_code == 0, result.output
    tables = _tables(result.output)
    changed, comms = tables["kernels changed most"], tables["collectives by op and dim"]
    for row in [*changed, *comms]:
        for column in ("calls_A", "calls_B"):
            assert "." not in row[column] or not float(row[column]).is_integer(), row
    send = next(r for r in payload["kernels_changed"] if r["short_name"] == "gloo:send")
    assert [r["calls_A"] for r in changed if r["short_name"] == "gloo:send"] == [f"{send['calls_A']:g}"]
    said = {(r["op"], r["dim"]): r for r in json.loads(runner.invoke(app, [
        "diff", "pp2_mb1", "pp2_mb8", "--db", str(db), "--json"]).stdout)["collectives"]}
    assert [float(r["MiB_A"]) for r in comms] == pytest.approx(
        [said[(r["op"], r["dim"])]["bytes_A"] / 2**20 for r in comms], abs=0.01)
    result = runner.invoke(app, ["diff", "moe_balanced", "moe_skewed", "--db", str(db)])
    assert result.exit_code == 0 and "note: explains_pct is blank for stage(s) 0: TOTAL changed less" in result.output
    result = runner.invoke(app, ["diff", "gpt", "hostbound", "--db", str(db)])
    assert result.exit_code == 0 and "vanished from A" in result.output
    result = runner.invoke(app, ["diff", "gpt", "nope", "--db", str(db)])
    assert result.exit_code != 0 and "unknown run 'nope'" in str(result.exception)


def _tables(output: str) -> dict[str, list[dict[str, str]]]:
    """Each rich table of ``output`` by the start of its title: its rows as {header: cell}."""
    tables: dict[str, list[dict[str, str]]] = {}
    title, header = "", []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│" if line.startswith("│") else "┃")[1:-1]]
        if line.startswith("┃"):
            header = cells
        elif line.startswith("│"):
            tables.setdefault(title, []).append(dict(zip(header, cells, strict=True)))
        elif line.strip() and not line.startswith(("┏", "┡", "└")):
            title = line.strip()
    return {t.split(" (")[0]: rows for t, rows in tables.items()}
