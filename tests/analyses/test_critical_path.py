"""The cross-rank critical path: a hand-walked 4-rank run, the samples' known structure, and single GPU ranks
checked against their raw JSON."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.analyses.test_breakdown import run_data
from tests.analyses.test_breakdown_real import _union_ns
from tests.analyses.test_stragglers import EVENTS, INSTANCE_OF, STEPS
from tests.conftest import ROOT, SAMPLES, TRACES, add_run
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses import critical_path as cp
from traceana.cli.main import app

REAL = {"moe_skewed": SAMPLES / "moe_skewed", "toy8_tp2pp2dp2_1f1b": SAMPLES / "toy8_tp2pp2dp2_1f1b",
        "hta_rank3of8_6steps": TRACES / "kineto" / "hta_rank3of8_6steps.json.gz",
        "h200_gpt_h2048_L8_s1024_gb4": TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"}


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    folder = tmp_path_factory.mktemp("cp")
    with store.connect(folder / "t.duckdb") as connection:
        store.write_run(connection, "hand", run_data(
            EVENTS, STEPS, pp={0: 0, 1: 0, 2: 1, 3: 1},
            instances={(EVENTS[i][0], i): inst for i, inst in INSTANCE_OF.items()}))
        for name, path in REAL.items():
            add_run(connection, name, [path], "kineto", EXPERIMENTS[name][0] if name in EXPERIMENTS else None)
        yield connection


def path_of(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> pl.DataFrame:
    segments = cp.of_step(con, run_id, step)[2]
    assert segments["start_ns"][1:].to_list() == segments["end_ns"][:-1].to_list()  # the segments tile the step
    return segments


def test_hand_walked_run(con: duckdb.DuckDBPyConnection) -> None:
    # Step 1 is [0, 2000) on every rank; rank 1's work ends last (its TP kernel at 1200), so the walk starts there.
    # Rank 1 arrived last at TP instance 4 (no jump); before it, its PP recv [800, 900) waited for rank 3 (arrived
    # 850); rank 3's DP kernel [550, 700) waited for rank 2 (arrived 600, the last of four); rank 2 computed [0, 300).
    got = path_of(con, "hand", 1).select("rank", "kind", "dim", "start_ns", "end_ns").rows()
    assert got == [(2, "compute", None, 0, 300), (2, "idle", None, 300, 600), (3, "comm", "DP", 600, 700),
                   (3, "idle", None, 700, 850), (1, "comm", "PP", 850, 900), (1, "idle", None, 900, 1100),
                   (1, "comm", "TP", 1100, 1200), (1, "idle", None, 1200, 2000)]


@pytest.mark.parametrize("step", [2, 3])
def test_skewed_moe_path_runs_through_the_hot_ranks_compute(con: duckdb.DuckDBPyConnection, step: int) -> None:
    # moe_skewed routes 112 tokens to the expert on ranks 0 and 2, 16 to the one on ranks 1 and 3 (the sample's
    # config): the cold ranks wait at the all-to-alls, so the path jumps from them to a hot rank and its compute.
    segments = path_of(con, "moe_skewed", step)
    compute = segments.filter(pl.col("kind") == "compute").group_by("rank").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns"))
    per_rank = dict(compute.rows())
    assert sum(per_rank.get(r, 0) for r in (0, 2)) > 2 * sum(per_rank.get(r, 0) for r in (1, 3))


def test_toy8_path_crosses_stages_through_the_pipeline_messages(con: duckdb.DuckDBPyConnection) -> None:
    # Layout tp=2,pp=2,dp=2 with order tp-cp-ep-dp-pp: TP and DP groups lie within a stage, so the only way from
    # one stage to the other is a PP send/recv pair.
    for step in (2, 3):
        segments = path_of(con, "toy8_tp2pp2dp2_1f1b", step).with_row_index()
        crossings = segments.filter(pl.col("stage") != pl.col("stage").shift(1))
        assert crossings.height >= 2 and set(segments["stage"]) == {0, 1}
        assert crossings.select("kind", "dim").unique().rows() == [("comm", "PP")]


@pytest.mark.parametrize("name", ["hta_rank3of8_6steps", "h200_gpt_h2048_L8_s1024_gb4"])
def test_single_rank_path_is_its_busy_chain(con: duckdb.DuckDBPyConnection, name: str) -> None:
    # One rank: the path is busy exactly where some kernel / memcpy / memset runs (the union, read from the raw
    # JSON here) and idle elsewhere in the step window.
    with gzip.open(REAL[name]) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    events = [(base + round(e["ts"] * 1000), base + round(e["ts"] * 1000) + round(e.get("dur", 0) * 1000))
              for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                      "gpu_memset")]
    windows = con.execute("SELECT step, start_ns, end_ns FROM step_windows WHERE run_id = ?", [name]).fetchall()
    for step, w0, w1 in windows:
        segments = path_of(con, name, step)
        busy = _union_ns([(max(a, w0), min(b, w1)) for a, b in events if a < w1 and b > w0 and b > a])
        on_path = segments.filter(pl.col("kind") != "idle").select(pl.col("end_ns") - pl.col("start_ns")).sum()
        assert (segments["start_ns"].min(), segments["end_ns"].max()) == (w0, w1)
        assert on_path.item() == busy, step
        assert segments["rank"].n_unique() == 1


def test_command_json_table_and_plot(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    with store.connect(db) as writer:
        store.write_run(writer, "hand", run_data(
            EVENTS, STEPS, pp={0: 0, 1: 0, 2: 1, 3: 1},
            instances={(EVENTS[i][0], i): inst for i, inst in INSTANCE_OF.items()}))
    runner = CliRunner()
    result = runner.invoke(app, ["critical-path", "--db", str(db), "--step", "1", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["length_ms"] == 0.002
    shares = {r["rank"]: r["share_pct"] for r in payload["by_rank"]}
    assert shares == {1: 57.5, 2: 30.0, 3: 12.5}  # 1150, 600 and 250 of the walk's 2000 ns
    assert sum(r["share_pct"] for r in payload["by_kind"]) == pytest.approx(100)
    on_path = sum(r["duration_ms"] for r in payload["by_kind"] if r["kind"] == "comm")
    assert payload["communication"]["comm_ms"] == pytest.approx(on_path) and on_path > 0
    text = runner.invoke(app, ["critical-path", "--db", str(db), "--step", "1"]).output
    split = payload["communication"]
    assert (f"communication on the path: {split['comm_ms']:,.3f} ms, {split['exposed_ms']:,.3f} ms of it exposed "
            f"and {split['overlapped_ms']:,.3f} ms under compute") in text
    png = tmp_path / "cp.png"
    result = runner.invoke(app, ["critical-path", "--db", str(db), "--plot", str(png)])
    assert result.exit_code == 0 and "hop by hop" in result.output and png.stat().st_size > 10_000
    result = runner.invoke(app, ["critical-path", "--db", str(db), "--step", "9"])
    assert result.exit_code != 0 and "no such step" in str(result.exception)


def test_a_step_without_work_is_one_idle_segment() -> None:
    windows = pl.DataFrame({"rank": [0], "pp": [None], "start_ns": [100], "end_ns": [400]},
                           schema={"rank": pl.Int32, "pp": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64})
    nodes = pl.DataFrame(schema={"rank": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "category": pl.String,
                                 "event_id": pl.Int64, "dim": pl.String, "ranks_seen": pl.Int32, "last_rank": pl.Int32,
                                 "last_start_ns": pl.Int64, "launch_ns": pl.Int64})
    assert cp.walk(windows, nodes).select("rank", "kind", "start_ns", "end_ns").rows() == [(0, "idle", 100, 400)]


SYNTH_CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"


def synthesized_path(tmp: Path, *straggler: object, fmt: str = "kineto") -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    """Synthesize 8 ranks (tp=2 dp=2 pp=2) x 3 steps with a straggler, ingest, and walk step 1's path. Returns the
    ground truth, the path's compute time per rank (ns) with the truth's COMP_ns of the step beside it, and the
    path's segments."""
    out, db = tmp / "run", tmp / "run.duckdb"
    runner = CliRunner()
    for args in (["synth", SYNTH_CONFIG, out, "--ranks", 8, "--steps", 3, "--format", fmt, *straggler],
                 ["ingest", out / "traces", "--db", db, "--layout", "tp=2,dp=2,pp=2", "--run-id", "synth"]):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    truth = json.loads((out / "truth.json").read_text())
    with store.connect(db, read_only=True) as connection:
        segments = path_of(connection, "synth", 1)
    on_path = (segments.filter(pl.col("kind") == "compute").group_by("rank")
               .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("path_ns")))
    comp = pl.DataFrame(truth["steps"]).filter(pl.col("step") == 1).select(pl.col("rank").cast(pl.Int32), "COMP_ns")
    comp = comp.join(on_path, on="rank", how="left").with_columns(pl.col("path_ns").fill_null(0)).sort("rank")
    return truth, comp, segments


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "ascend"])
def test_synthesized_straggler_rank_carries_the_path(tmp_path: Path, fmt: str) -> None:
    # Rank 5's compute runs 1.3x longer, so its TP partner (rank 4) waits for it at every all-reduce, and stage 0
    # waits for its activations' gradients: the path walks rank 5's compute through the step. Measured (Kineto):
    # 20.3 ms of its 21.3 ms COMP (truth) is on the path, 95 %; the rest of the path's compute is the pipeline's
    # fill and drain on stage 0 (its first forward, its last backward and optimizer step), 0.3 to 0.8 ms per rank.
    truth, comp, _ = synthesized_path(tmp_path, "--straggler-rank", 5, "--slowdown", 1.3, fmt=fmt)
    assert truth["straggler"]["rank"] == 5
    share = dict(zip(comp["rank"], comp["path_ns"] / comp["COMP_ns"], strict=True))
    assert share[5] > 0.85
    others = {r: s for r, s in share.items() if r != 5}
    assert max(others.values()) < 0.15, others
    path_compute = comp["path_ns"].sum()
    assert comp.filter(pl.col("rank") == 5)["path_ns"].item() > 0.85 * path_compute


def test_synthesized_straggler_stage_carries_the_path(tmp_path: Path) -> None:
    # Stage 0's compute runs 2x longer: per micro-batch, 2 x its forward, backward and weight gradient outlast
    # stage 1's (which also carries the output layer and the loss over 50k logits: 19.5 ms a step against stage 0's
    # 12.7, so 1.5x would leave stage 1 the slower), so stage 1 waits for each activation and each of its gradients
    # waits for stage 0 to take it. The path runs on stage 0 but for the pipeline's fill (stage 1's first
    # micro-batch, which stage 0's first backward waits for) and drain. Measured: 21.8 ms of the path's 26.6 ms
    # compute is stage 0's (82 %); by length, stage 0 carries 80 % of the path.
    truth, comp, segments = synthesized_path(tmp_path, "--straggler-stage", 0, "--slowdown", 2.0)
    stage0 = [r["rank"] for r in truth["ranks"] if r["pp"] == 0]
    assert len(stage0) == 4
    assert comp.filter(pl.col("rank").is_in(stage0))["path_ns"].sum() > 0.7 * comp["path_ns"].sum()
    by_stage = cp.report(segments)["by_stage"]
    assert by_stage["stage"][0] == 0 and by_stage["share_pct"][0] > 70

    # The coupling the path follows, read from the raw Kineto JSON of pipeline 0 (rank 0 on stage 0, rank 4 on
    # stage 1; one host, one clock): the k-th send from one is the k-th recv at the other, and the two end at the
    # same ns. The slow stage is the later side of every transfer of the steady 1F1B state: its activation sends
    # start after stage 1's receives, and its gradient receives after stage 1's sends. The exceptions are the
    # fill and drain of each step's 8 micro-batches: stage 0's warm-up forward of micro-batch 1 is sent before stage
    # 1 is done with micro-batch 0, and stage 0 waits for the gradients of micro-batches 0 and 7.
    rank0, rank4 = (next((tmp_path / "run" / "traces").glob(f"*_{100_000 + r}.*.json")) for r in (0, 4))
    assert truth["ranks"][0]["host"] == truth["ranks"][4]["host"]
    sent, received = _p2p_kernels(rank0), _p2p_kernels(rank4)
    assert len(sent["send"]) == len(sent["recv"]) == len(received["send"]) == len(received["recv"]) == 3 * 8
    forward = list(zip(sent["send"], received["recv"], strict=True))
    backward = list(zip(received["send"], sent["recv"], strict=True))
    assert all(send[1] == recv[1] for send, recv in forward + backward)
    assert [send[0] > recv[0] for send, recv in forward] == [mb != 1 for mb in range(8)] * 3
    assert [recv[0] > send[0] for send, recv in backward] == [mb not in (0, 7) for mb in range(8)] * 3


def _p2p_kernels(path: Path) -> dict[str, list[tuple[int, int]]]:
    """(start, end) ns of the send and the recv kernels of a Kineto trace, in time order, from its raw JSON."""
    found: dict[str, list[tuple[int, int]]] = {"send": [], "recv": []}
    for event in json.loads(path.read_text())["traceEvents"]:
        name = event.get("args", {}).get("Collective name") if event.get("cat") == "kernel" else None
        if name in found:
            start = round(float(event["ts"]) * 1000)
            found[name].append((start, start + round(float(event["dur"]) * 1000)))
    return {name: sorted(spans) for name, spans in found.items()}


def test_path_communication_splits_into_exposed_and_overlapped(con: duckdb.DuckDBPyConnection) -> None:
    """Issue 23 §3(c) on hta_rank3of8_6steps: one rank, so the path's exposed communication is exactly the time the
    raw JSON's NCCL kernels run with no other kernel, memcpy or memset (|union(all)| - |union(non-NCCL)| in each
    window) and the breakdown's ΣWAIT; what runs under compute is overlapped, at most the breakdown's OVERLAPPED."""
    name = "hta_rank3of8_6steps"
    with gzip.open(REAL[name]) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    events = [(base + round(e["ts"] * 1000), base + round(e["ts"] * 1000) + round(e.get("dur", 0) * 1000),
               e["name"].startswith("nccl")) for e in raw["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rows = con.execute("SELECT w.step, w.start_ns, w.end_ns, b.OTHER_WAIT_ns, b.OVERLAPPED_ns FROM step_windows w "
                       "JOIN rank_step_breakdown b USING (run_id, rank, step) WHERE run_id = ?", [name]).fetchall()
    assert len(rows) == 6
    for step, w0, w1, wait, overlapped in rows:
        clipped = [(max(a, w0), min(b, w1), nccl) for a, b, nccl in events if a < w1 and b > w0 and b > a]
        exposed = _union_ns([(a, b) for a, b, _ in clipped]) - _union_ns([(a, b) for a, b, n in clipped if not n])
        split = cp.communication(con, name, step, path_of(con, name, step))
        assert round(split["exposed_ms"] * 1e6) == exposed == wait, step
        assert 0 < split["overlapped_ms"] * 1e6 <= overlapped
        assert split["comm_ms"] == pytest.approx(split["exposed_ms"] + split["overlapped_ms"], abs=1e-9)
