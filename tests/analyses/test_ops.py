"""`traceana ops`: the rows of each rank-step add up to its breakdown exactly (views event_time, op_time), and the
top rows agree with a second route over the raw files: the Kineto JSON (outermost CPU op, nn.Module ranges), the
nsys SQLite export (NVTX ranges on the launching thread) and Ascend's kernel_details.csv."""

from __future__ import annotations

import bisect
import csv
import gzip
import json
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import polars as pl
import pytest

from tests.conftest import SAMPLES, TRACES, ingested, one_line, run_cli, run_main
from tests.test_sample_traces import EXPERIMENTS
from traceana import store

H200 = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
B200 = TRACES / "kineto" / "tracelens_b200_rank0of8_vllm.json.gz"
H100 = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
ASCEND = TRACES / "ascend" / "torch_npu_2rank_level1"
WAITS = ("MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("ops") / "t.duckdb", {
        "h200": (H200, None), "b200": (B200, None), "h100": (H100, None), "ascend": (ASCEND, None),
        "toy8": (SAMPLES / "toy8_tp2pp2dp2_1f1b", EXPERIMENTS["toy8_tp2pp2dp2_1f1b"][0]),
        "moe_skewed": (SAMPLES / "moe_skewed", EXPERIMENTS["moe_skewed"][0])})


@pytest.fixture(scope="module")
def con(db: Path) -> duckdb.DuckDBPyConnection:
    with store.connect(db, read_only=True) as connection:
        yield connection


def test_events_add_up_to_every_rank_step_exactly(con: duckdb.DuckDBPyConnection) -> None:
    parts = ("COMP", *WAITS)
    differences = con.execute(f"""
        WITH e AS (SELECT run_id, rank, step, {', '.join(f'sum({p}_ns) AS {p}' for p in parts)} FROM op_time
                   GROUP BY ALL)
        SELECT b.run_id, count(*), {', '.join(f'max(abs(coalesce(e.{p}, 0) - b.{p}_ns))' for p in parts)},
               {' + '.join(f'sum(b.{w}_ns)' for w in WAITS)}
        FROM rank_step_breakdown b LEFT JOIN e USING (run_id, rank, step) GROUP BY 1 ORDER BY 1""").fetchall()
    assert [d[0] for d in differences] == ["ascend", "b200", "h100", "h200", "moe_skewed", "toy8"]
    for run, rank_steps, *diffs, _ in differences:
        assert rank_steps > 0 and diffs == [0] * len(parts), (run, diffs)
    waits = {d[0]: d[-1] for d in differences}
    assert waits["toy8"] > 0 and waits["moe_skewed"] > 0  # the waits' split by dim is checked, not only COMP


def _json(db: Path, *args: object) -> dict:
    return json.loads(run_cli("ops", *args, "--db", db, "--json").stdout)


def _rows_add_up(db: Path, con: duckdb.DuckDBPyConnection, run: str, by: str, step: str) -> dict:
    """`ops --json` for one step of ``run``: its rows' COMP sums to the breakdown's mean COMP within 1 µs."""
    out = _json(db, run, "--by", by, "--step", step, "--top", "1000")
    comp = con.execute("SELECT avg(COMP_ns) / 1e6 FROM rank_step_breakdown WHERE run_id = ? AND step = ?",
                       [run, int(step)]).fetchall()[0][0]
    assert abs(sum(r["COMP_ms"] for r in out["rows"]) - comp) < 1e-3
    return {r[by]: r for r in out["rows"]}


def _top_level(ranges: list[tuple[int, int, str]]) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The ranges of one thread that no other contains (sorted by start), and their starts for bisect."""
    out: list[tuple[int, int, str]] = []
    for start, end, name in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if not out or start >= out[-1][1]:
            out.append((start, end, name))
    return [r[0] for r in out], out


def _around(index: tuple[list[int], list[tuple[int, int, str]]] | None, t: int) -> str | None:
    if index is None:
        return None
    i = bisect.bisect_right(index[0], t) - 1
    return index[1][i][2] if i >= 0 and index[1][i][0] <= t <= index[1][i][1] else None


def _kineto_launch_scopes(path: Path, ranges_of: callable) -> list[str | None]:
    """For each kernel / copy / memset of a Kineto file: the top-level range (``ranges_of`` picks them from the
    events) on its launching runtime call's thread at that call's start, in ns as the trace's µs times 1000."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ns = lambda v: round(float(v) * 1000)  # noqa: E731
    threads: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for e in ranges_of(events):
        threads[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]))
    index = {k: _top_level(v) for k, v in threads.items()}
    calls = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            calls.setdefault(e["args"]["correlation"], (e["pid"], e["tid"], ns(e["ts"])))
    out = []
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("dur", 0) > 0:
            call = calls.get(e["args"].get("correlation"))
            out.append(None if call is None else _around(index.get(call[:2]), call[2]))
    return out


def test_h200_by_op_against_the_json(db: Path, con: duckdb.DuckDBPyConnection) -> None:
    """Each kernel under the outermost CPU op of its launching thread: counted over the raw JSON for the whole
    trace, against op_time over both steps (every device event of this trace lies in a step window)."""
    raw = Counter(_kineto_launch_scopes(H200, lambda events: [
        e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#")]))
    stored = dict(con.execute("SELECT op, count(*) FROM op_time WHERE run_id = 'h200' GROUP BY op").fetchall())
    top = [op for op, _ in raw.most_common(6)]
    assert "aten::linear" in top
    assert {op: stored.get(op) for op in top} == {op: raw[op] for op in top}
    assert sum(raw.values()) == sum(stored.values())
    rows = _rows_add_up(db, con, "h200", "op", "2")
    assert rows["aten::linear"]["kernels"] == raw["aten::linear"] / 2  # two identical training steps
    assert rows["autograd::engine::evaluate_function: AddmmBackward0"]["COMP_ms"] > rows["aten::linear"]["COMP_ms"]


def test_b200_by_module_and_layer_against_the_json(db: Path, con: duckdb.DuckDBPyConnection) -> None:
    """Kernels per TransformerBlock_N from the raw nn.Module ranges, against `--by layer`; the module rows add up."""
    block = "nn.Module: TransformerBlock_"
    raw = Counter(_kineto_launch_scopes(B200, lambda events: [
        e for e in events if e.get("cat") == "python_function" and e["name"].startswith(block)]))
    layers = _rows_add_up(db, con, "b200", "layer", "0")
    blocks = {name.removeprefix("nn.Module: "): n for name, n in raw.items() if name}
    assert len(blocks) == 36 and all(n == 25 for n in blocks.values())
    assert {k: layers[k]["kernels"] for k in blocks} == blocks
    modules = _rows_add_up(db, con, "b200", "module", "0")
    assert any(m.endswith("TransformerBlock_3 / MLPBlock_3 / FusedMoE_3") for m in modules)


def test_h100_nsys_by_nvtx_against_the_sqlite(db: Path, con: duckdb.DuckDBPyConnection) -> None:
    """Events launched inside an NVTX range of the launching thread, per process, from the export's own tables."""
    with sqlite3.connect(H100) as raw:
        ranges: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
        for tid, start, end in raw.execute("SELECT globalTid, start, end FROM NVTX_EVENTS "
                                           "WHERE eventType IN (59, 60, 70, 71) AND end IS NOT NULL"):
            ranges[tid].append((start, end, ""))
        index = {tid: _top_level(r) for tid, r in ranges.items()}
        launched = raw.execute("""SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN (
            SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE end > start
            UNION ALL SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE end > start
            UNION ALL SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE end > start) d
            ON d.correlationId = r.correlationId AND d.globalPid = (r.globalTid / 16777216) * 16777216""").fetchall()
    inside = sum(_around(index.get(tid), t) is not None for tid, t in launched)
    rows = _rows_add_up(db, con, "h100", "nvtx", "0")
    assert inside > 1000
    assert round(sum(r["kernels"] for name, r in rows.items() if name != "(none)") * 2) == inside


def test_ascend_by_op_against_kernel_details(db: Path, con: duckdb.DuckDBPyConnection) -> None:
    rows = _rows_add_up(db, con, "ascend", "op", "50")
    raw = Counter()
    for rank in (0, 1):
        with (ASCEND / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").open() as f:
            raw.update(r["Name"].split("_")[0] for r in csv.DictReader(f) if r["Name"].startswith("aclnnMm_"))
    assert rows["aclnnMm"]["kernels"] * 2 == raw["aclnnMm"] > 0
    assert rows["hcom_allReduce"]["OTHER_WAIT_ms"] > 0  # no --layout: the all-reduces' dim is unknown


def test_a_level_the_run_lacks_is_one_line(db: Path) -> None:
    code, _, err = run_main("ops", "h200", "--by", "module", "--db", db)
    assert "supports --by op" in one_line(code, err) and "nn.Module" in err
    code, _, err = run_main("ops", "h200", "--by", "kernel", "--db", db)
    assert "choose one of op, module, layer, nvtx" in one_line(code, err)


def test_table_notes_top_and_plot(db: Path, tmp_path: Path) -> None:
    out = run_cli("ops", "h200", "--top", "3", "--plot", tmp_path / "ops.png", "--db", db).stdout
    assert "(22 others)" in out and "note: no nn.Module ranges" in out
    assert (tmp_path / "ops.png").stat().st_size > 10_000
    rows = _json(db, "h200", "--top", "3")["rows"]
    assert len(rows) == 4 and rows[0]["step_pct"] > rows[1]["step_pct"]


def test_report_section_per_level(db: Path, tmp_path: Path) -> None:
    pytest.importorskip("bokeh")
    run_cli("report", "b200", "--db", db, "--html", tmp_path / "b200.html")
    page = (tmp_path / "b200.html").read_text()
    assert all(f"device time by {level}" in page for level in ("layer", "module", "op"))
    assert "device time by nvtx" not in page and "TransformerBlock_3 / MLPBlock_3" in page


def test_the_icicle_leaves_add_up_to_the_rows(con: duckdb.DuckDBPyConnection) -> None:
    """`tree`, what the report's icicle splits: its leaves hold the same time per part as `ops` rows (each event
    once), its paths are the module paths (B200) or NVTX paths (nsys), and its ops and kernels are op_time's."""
    from traceana.analyses.ops import attribute, tree

    for run, by, path in (("b200", "module", "module"), ("h100", "nvtx", "nvtx"), ("h200", "op", None)):
        leaves, rows = tree(con, run), attribute(con, run, by).frame
        for part in ("kernels", "COMP_ms", *(f"{w}_ms" for w in WAITS)):
            assert leaves[part].sum() == pytest.approx(rows[part].sum(), abs=1e-9), (run, part)
        if path is not None:
            shown = set(rows.filter(pl.col(by) != "(none)")[by])
            assert set(leaves["path"].drop_nulls()) == shown
    ops = tree(con, "h200").group_by("op").agg(pl.col("COMP_ms").sum())
    assert dict(ops.iter_rows()) == pytest.approx(dict(attribute(con, "h200", "op").frame.select(
        pl.col("op").replace("(none)", None), "COMP_ms").iter_rows()))
