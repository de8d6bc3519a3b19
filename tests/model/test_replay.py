"""Replay, what-if and advise (DESIGN §8) on real traces: the replay of an unchanged step against the store's own
measured breakdown (computed by the §4 views, not by the replay), what-ifs against identities and hand-computed
bounds, advise's first findings, and every bad --change as a one-line error with exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import SAMPLES, TRACES, add_run, run_cli, run_main
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.model import advise, replay, whatif

# shared traces with device activity, one run each
SHARED_RUNS = {
    "hta_rank0of2": ("kineto/hta_rank0of2_pg_args.json.gz", "kineto"),
    "hta_rank3of8": ("kineto/hta_rank3of8_6steps.json.gz", "kineto"),
    "hta_rank0of16": ("kineto/hta_rank0of16_a2a_rs_ag.json.gz", "kineto"),
    "h200_gpt": ("kineto/h200_gpt_h2048_L8_s1024_gb4.json.gz", "kineto"),
    "h200_hostbound": ("kineto/h200_hostbound_h512_L12_s256_gb8.json.gz", "kineto"),
    "b200": ("kineto/tracelens_b200_rank0of8_vllm.json.gz", "kineto"),
    "mi300": ("kineto/tracelens_mi300_rank0of8_rccl.json.gz", "kineto"),
    "nsys_h100": ("nsys/nsysai_h100_2proc_nsys2026.2.sqlite", "nsys"),
    "cloverleaf": ("nsys/pipit_cloverleaf_4gpu_nsys2024.5.sqlite", "nsys"),
    "saxpy": ("nsys/pipit_saxpy_mpi_1rank_nsys2022.2.sqlite", "nsys"),
    "ascend_l0": ("ascend/torch_npu_2rank_level0", "ascend"),
    "ascend_l1": ("ascend/torch_npu_2rank_level1", "ascend"),
    "ascend_l1_db": ("ascend/torch_npu_2rank_level1_db", "ascend"),
}
SAMPLE_RUNS = tuple(EXPERIMENTS)  # all seven


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "runs.duckdb"
    with store.connect(path) as con:
        for run, (rel, fmt) in SHARED_RUNS.items():
            add_run(con, run, [TRACES / rel], fmt)
        for name in SAMPLE_RUNS:
            add_run(con, name, [SAMPLES / name], "kineto", EXPERIMENTS[name][0])
    return path


@pytest.mark.parametrize("run", ["h200_gpt", "toy8_tp2pp2dp2_1f1b"])
def test_the_graph_names_each_event_as_the_store_does(db: Path, run: str) -> None:
    # names travel as codes of the run's distinct names (a 1,024-rank dataset's 785 MiB of text could not be
    # sorted in a reader's 1 GiB): each event must get its own name back, not a neighbour's in the dictionary
    from traceana.model import graph as dependency

    with store.connect(db, read_only=True) as con:
        events = dependency.build(con, run).events
        stored = con.sql("SELECT rank, event_id, name FROM device_events WHERE run_id = ?", params=[run]).pl()
    assert events.schema["name"] == pl.Categorical and events["name"].n_unique() > 10
    joined = events.select("rank", "event_id", pl.col("name").cast(pl.String)).join(
        stored, on=["rank", "event_id"], suffix="_stored")
    assert joined.height == events.height and (joined["name"] == joined["name_stored"]).all()


def _replayed(db: Path, run: str) -> pl.DataFrame:
    with store.connect(db, read_only=True) as con:
        return replay.replay_run(con, run)[1]


def _whatif(db: Path, run: str, step: int | None, *changes: str) -> pl.DataFrame:
    """Per rank (and step, of ``step`` or all): the measured and predicted breakdown after ``changes``."""
    with store.connect(db, read_only=True) as con:
        frame = whatif.whatif_run(con, run, [whatif.parse(c) for c in changes])[1]
    return frame if step is None else frame.filter(pl.col("step") == step)


@pytest.mark.parametrize("run", [*SHARED_RUNS, *SAMPLE_RUNS])
def test_replay_reproduces_the_measured_step(db: Path, run: str) -> None:
    frame = _replayed(db, run)
    error = frame["error_pct"].abs()
    assert error.median() <= 3.0 and error.max() <= 8.0, frame.select("step", "rank", "TOTAL_ms", "replayed_TOTAL_ms")
    # every measured length is kept; only overlap between streams can move (b200: 3.4%, its streams overlap)
    assert (frame["replayed_COMP_ms"] - frame["COMP_ms"]).abs().max() <= 0.05 * frame["COMP_ms"].max() + 1e-3


def test_an_outside_wait_is_kept_and_reported(db: Path) -> None:
    """hta_rank0of16: every step, the device sits tens of ms with work queued while neither the device nor the host
    traces anything (around 857.69 ms of step 550, a memset of a CUDA graph launched 129 ms before: the raw JSON
    has no event on any thread or stream in the 36 ms before it and the 64 ms after). The graph cannot know what it
    waited on: the hold is kept as a fixed delay and reported, and without it the replay would run 42% short."""
    frame = _replayed(db, "hta_rank0of16")
    assert (frame["external_hold_ms"] > 20).all()
    assert ((frame["TOTAL_ms"] - frame["replayed_TOTAL_ms"]).abs() < frame["external_hold_ms"]).all()


def test_whatif_without_a_change_predicts_the_measured_step(db: Path) -> None:
    frame = _whatif(db, "moe_skewed", 3, "dim=EP:1", "kernel=*:1")  # host=1 is refused: no launch records
    assert np.allclose(frame["predicted_TOTAL_ms"], frame["TOTAL_ms"], atol=1e-6)
    assert (frame["gain_ms"].abs() < 1e-6).all()


def test_rank_to_median_gives_every_rank_the_median_compute(db: Path) -> None:
    frame = _whatif(db, "moe_skewed", 3, "rank=*:median")
    median = float(np.median(frame["COMP_ms"].to_numpy()))  # all four ranks are one group (no pipeline stages)
    assert np.allclose(frame["predicted_COMP_ms"], median, rtol=2e-3)
    # the hot ranks 0 and 2 (112 tokens per expert) get faster, the cold ones slower
    gain = dict(zip(frame["rank"], frame["COMP_ms"] - frame["predicted_COMP_ms"], strict=True))
    assert gain[0] > 0 and gain[2] > 0 and gain[1] < 0 and gain[3] < 0


def test_a_rank_factor_scales_that_ranks_compute_alone(db: Path) -> None:
    # the CPU run's compute is the main thread's outermost ops, one after another: each twice as long, twice the union
    frame = _whatif(db, "moe_skewed", 3, "rank=1:2")
    comp = dict(zip(frame["rank"], zip(frame["COMP_ms"], frame["predicted_COMP_ms"], strict=True), strict=True))
    assert comp[1][1] == pytest.approx(2 * comp[1][0], rel=1e-3)
    assert all(after == pytest.approx(before, rel=1e-3) for r, (before, after) in comp.items() if r != 1)


def test_a_stage_factor_is_each_of_its_ranks_at_that_factor(db: Path) -> None:
    # toy8 (tp2 pp2 dp2): stage 1 is ranks 4-7 (the ranks table); stage=1:1.3 must replay as those four rank changes
    with store.connect(db, read_only=True) as con:
        ranks = [r for (r,) in con.execute("SELECT rank FROM ranks WHERE run_id = 'toy8_tp2pp2dp2_1f1b' AND pp = 1 "
                                           "ORDER BY rank").fetchall()]
    assert ranks == [4, 5, 6, 7]
    by_stage = _whatif(db, "toy8_tp2pp2dp2_1f1b", None, "stage=1:1.3").sort("rank", "step")
    by_ranks = _whatif(db, "toy8_tp2pp2dp2_1f1b", None, *(f"rank={r}:1.3" for r in ranks)).sort("rank", "step")
    assert by_stage["predicted_TOTAL_ms"].to_list() == by_ranks["predicted_TOTAL_ms"].to_list()
    slowed = by_stage.filter(pl.col("rank").is_in(ranks))
    assert (slowed["predicted_COMP_ms"] > 1.2 * slowed["COMP_ms"]).all()  # the change matters


def test_host_zero_leaves_the_device_work_of_a_host_bound_step(db: Path) -> None:
    """h200_hostbound: with the host's time removed the step is its kernels back to back. Bounds by hand: at least
    the measured COMP, at most COMP plus 2 µs per kernel and the measured tail after the last kernel."""
    frame = _whatif(db, "h200_hostbound", 2, "host=0")
    with store.connect(db, read_only=True) as con:
        kernels, tail_ms = con.execute(
            "SELECT count(*), (max(w.end_ns) - max(e.end_ns)) / 1e6 FROM device_events e JOIN step_windows w "
            "USING (run_id, rank) WHERE run_id = 'h200_hostbound' AND w.step = 2 AND e.start_ns >= w.start_ns "
            "AND e.start_ns < w.end_ns").fetchone()
    row = frame.row(0, named=True)
    assert row["IDLE_ms"] > 0.8 * row["TOTAL_ms"]  # measured: ~90% idle
    assert abs(row["predicted_COMP_ms"] - row["COMP_ms"]) < 0.002 * row["COMP_ms"]  # work clipped at the window
    assert row["COMP_ms"] <= row["predicted_TOTAL_ms"] <= row["COMP_ms"] + kernels * 0.002 + tail_ms


def test_advise_names_host_bound_idle_first(db: Path) -> None:
    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, "h200_hostbound")
    first = found.row(0, named=True)
    assert first["finding"] == "host-bound idle" and first["change"] == "host=0"
    assert first["gain_ms"] > 0.5 * first["measured_step_ms"]


def test_advise_finds_the_hot_expert_ranks(db: Path) -> None:
    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, "moe_skewed")
    row = found.row(0, named=True)  # the hot experts (112 tokens each on ranks 0 and 2) come first
    assert row["finding"] == "straggler ranks 0, 2" and row["change"] == "rank=0:median rank=2:median"
    # gloo syncs gradients in one blocking call: nothing ran beside it, so no overlap is proposed
    assert "overlap=DP" not in found["change"].to_list()
    assert row["gain_ms"] > 0 and math.isfinite(row["error_bar_ms"])


def _finding(db: Path, run: str, name: str) -> dict:
    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, run)
    rows = found.filter(pl.col("finding") == name)
    assert rows.height == 1, found.select("finding", "change")
    return rows.row(0, named=True)


def test_advise_prices_exposed_communication_of_unknown_dim(db: Path) -> None:
    """hta_rank3of8 (1 of 8 ranks, no process groups): OTHER_WAIT is a finding, priced by dim=UNKNOWN:0.5, naming
    the ops behind it (their time in the step checked by a SQL over the store) and what would name the dim. The
    replay says the step does not shorten (the device then waits on the host): a gain around 0 with its interval."""
    row = _finding(db, "hta_rank3of8", "exposed communication of unknown dim")
    assert row["change"] == "dim=UNKNOWN:0.5"
    with store.connect(db, read_only=True) as con:
        other = con.execute("SELECT OTHER_WAIT_ns / 1e6 FROM rank_step_breakdown WHERE run_id = 'hta_rank3of8' "
                            "AND step = 1010").fetchone()[0]
        ops = con.execute(
            "SELECT c.op, count(*), sum(e.end_ns - e.start_ns) / 1e6 FROM device_events e JOIN collectives c "
            "USING (run_id, rank, event_id) JOIN step_windows w USING (run_id, rank) WHERE run_id = 'hta_rank3of8' "
            "AND w.step = 1010 AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns GROUP BY c.op").fetchall()
    assert f"OTHER_WAIT {other:.2f} ms" in row["evidence"]
    for op, calls, ms in ops:  # AllToAll 7 calls 16.46 ms, AllReduce 3 calls 4.66 ms
        assert f"{op} {calls} calls {ms:.2f} ms" in row["evidence"]
    assert "1 of 8 ranks profiled" in row["evidence"] and "--layout" in row["evidence"]
    assert row["gain_low_ms"] <= row["gain_ms"] <= row["gain_high_ms"] and row["gain_high_ms"] > 0


def test_advise_prices_the_kernel_farthest_below_its_roof(db: Path) -> None:
    """h200_gpt: the cuDNN attention backward runs at 22.8% of its compute roof; the run's own output-layer GEMM
    (aten::mm 2048x50304 @ 50304x2048) reaches 94.3% of the same roof, the target its kernels are priced at:
    kernel=...:roof=94.3. Its time per step, checked by a SQL over the store, bounds the gain by hand: at most the
    kernel time saved, time x (1 - 22.8 / 94.3)."""
    from traceana.analyses import roofline

    row = _finding(db, "h200_gpt", "kernel below its roof: aten::_cudnn_attention_backward")
    with store.connect(db, read_only=True) as con:
        frame = roofline.measure(con, "h200_gpt").frame
        ms = con.execute(
            "SELECT sum(e.end_ns - e.start_ns) / 1e6 FROM event_ops o JOIN device_events e USING (run_id, rank, "
            "event_id) JOIN step_windows w USING (run_id, rank) WHERE run_id = 'h200_gpt' AND w.step = 2 AND "
            "o.op = 'aten::_cudnn_attention_backward' AND e.category = 'compute' AND e.start_ns >= w.start_ns "
            "AND e.start_ns < w.end_ns").fetchone()[0]
    achieved = float(frame.filter(pl.col("op") == "aten::_cudnn_attention_backward")["roof_pct"][0])
    compute = frame.filter((pl.col("bound") == "compute") & (pl.col("roof_pct") <= 100))
    best = compute.sort("roof_pct").row(-1, named=True)
    assert (best["op"], best["shapes"], round(best["roof_pct"], 1)) == ("aten::mm", "2048x50304, 50304x2048", 94.3)
    assert f"{ms:.3f} ms per step" in row["evidence"]
    assert "aten::mm (2048x50304, 50304x2048) at 94.3%" in row["evidence"]
    assert row["change"].count("kernel=") == 3 and all(
        c.endswith(":roof=94.3") for c in row["change"].split())  # bprop, dot(dO, O), dq conversion
    assert 0 < row["gain_ms"] <= ms * (1 - achieved / 94.3)
    assert "kernels the roofline cannot cost" in row["evidence"] and "(18%)" in row["evidence"]


def test_a_kernel_to_a_share_of_its_roof(db: Path) -> None:
    """kernel=PATTERN:roof=P scales each matched kernel by its op shape's achieved share / P: on h200_gpt's single
    stream the attention backward's bprop kernels (22.8% of their roof) to 50% shorten the step's COMP by their time
    x (1 - 22.8 / 50), computed here from the store by SQL; kernels already above P, or that the roofline cannot
    cost, keep their time (roof=20: nothing to change, refused as matching nothing)."""
    from traceana.analyses import roofline

    with store.connect(db, read_only=True) as con:
        achieved = float(roofline.measure(con, "h200_gpt").frame.filter(
            pl.col("op") == "aten::_cudnn_attention_backward")["roof_pct"][0])
        ns = con.execute(
            "SELECT sum(e.end_ns - e.start_ns) FROM device_events e JOIN step_windows w USING (run_id, rank) "
            "WHERE run_id = 'h200_gpt' AND w.step = 2 AND e.name LIKE '%flash_bprop%' AND e.start_ns >= w.start_ns "
            "AND e.start_ns < w.end_ns").fetchone()[0]
    row = _whatif(db, "h200_gpt", 2, "kernel=*flash_bprop*:roof=50").row(0, named=True)
    assert row["COMP_ms"] - row["predicted_COMP_ms"] == pytest.approx(ns * (1 - achieved / 50) / 1e6, abs=1e-3)
    assert str(whatif.parse("kernel=*flash_bprop*:ROOF=50")) == "kernel=*flash_bprop*:roof=50"
    out = run_cli("whatif", "h200_gpt", "--change", "kernel=*flash_bprop*:roof=20", "--db", db, check=False)
    assert out.returncode == 2 and "below 20% of its roof" in out.stderr
    out = run_cli("whatif", "h200_hostbound", "--change", "kernel=*:roof=70", "--db", db, check=False)
    assert out.returncode == 2 and "no roofline" in out.stderr and out.stderr.count("\n") == 1


def test_dp_overlapped_with_the_backward_in_its_buckets(db: Path) -> None:
    """tp2dp2_mlp reduces its gradients in two 1 MiB buckets a step after the backward (sample_traces/README.md;
    counted here by SQL). overlap=DP:backward lets the first run beside the backward and keeps the last exposed:
    per rank its predicted step lies between overlap=DP's (nothing waits for DP, the bound) and the measured one,
    and a step gains at most its largest exposed DP time. advise proposes it with the buckets as evidence; a run with
    one DP call a step (toy8) has no bucket before the last: a one-line error."""
    with store.connect(db, read_only=True) as con:
        calls = con.execute(
            "SELECT count(*), min(c.bytes), max(c.bytes) FROM collectives c JOIN device_events e USING (run_id, "
            "rank, event_id) JOIN step_windows w USING (run_id, rank) WHERE run_id = 'tp2dp2_mlp' AND w.step = 3 "
            "AND c.dim = 'DP' AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns").fetchone()
    assert calls == (8, 1 << 20, 1 << 20)  # 4 ranks x 2 buckets
    keys = ["rank", "step"]
    bucketed = _whatif(db, "tp2dp2_mlp", None, "overlap=DP:backward")
    bound = _whatif(db, "tp2dp2_mlp", None, "overlap=DP").select(*keys, pl.col("predicted_TOTAL_ms").alias("bound"))
    both = bucketed.join(bound, on=keys)
    assert (both["bound"] <= both["predicted_TOTAL_ms"] + 1e-6).all()
    assert (both["predicted_TOTAL_ms"] <= both["TOTAL_ms"] + 1e-6).all()
    gains = both.group_by("step").agg((pl.col("TOTAL_ms") - pl.col("predicted_TOTAL_ms")).max().alias("gain"),
                                      pl.col("DP_WAIT_ms").max())  # a rank also waits (on TP) for a peer's DP
    assert (gains["gain"] <= gains["DP_WAIT_ms"] + 1e-3).all() and (gains["gain"] > 1).all()
    row = _finding(db, "tp2dp2_mlp", "exposed DP communication, overlapped with the backward")
    assert row["change"] == "overlap=DP:backward" and "2 buckets a step of 1 MiB" in row["evidence"]
    out = run_cli("whatif", "toy8_tp2pp2dp2_1f1b", "--change", "overlap=DP:backward", "--db", db, check=False)
    assert out.returncode == 2 and "one DP collective a step" in out.stderr


def test_advise_prices_cuda_graphs_below_the_host_zero_bound(db: Path) -> None:
    """h200_hostbound: host=0 is the upper bound; CUDA graphs (host=capturable:0) keep the optimizer's host time,
    so they predict a longer step, by at most that time (the Optimizer.* annotations in the step, by SQL)."""
    bound = _finding(db, "h200_hostbound", "host-bound idle")
    graphs = _finding(db, "h200_hostbound", "host-bound idle: CUDA graphs")
    assert "upper bound" in bound["evidence"] and graphs["change"] == "host=capturable:0"
    with store.connect(db, read_only=True) as con:
        kept = con.execute(
            "SELECT sum(least(a.end_ns, w.end_ns) - greatest(a.start_ns, w.start_ns)) / 1e6 FROM annotations a "
            "JOIN step_windows w USING (run_id, rank) WHERE run_id = 'h200_hostbound' AND w.step = 2 AND "
            "a.kind = 'user_annotation' AND a.name LIKE 'Optimizer.%' AND a.end_ns > w.start_ns AND "
            "a.start_ns < w.end_ns").fetchone()[0]
    assert 0 < graphs["gain_ms"] < bound["gain_ms"]
    assert graphs["predicted_step_ms"] - bound["predicted_step_ms"] <= kept  # 0.13 of 1.07 ms


def test_advise_names_the_hot_expert_ranks_behind_the_ep_wait(db: Path) -> None:
    """moe_skewed: the EP finding names ranks 0 and 2, their AllToAll load (by SQL: 704 KiB received against
    320 KiB; the dispatch / combine calls 224 KiB against 32 KiB, 112 against 16 tokens of 512 fp32, sample_traces
    README), and points at the straggler finding it follows."""
    row = _finding(db, "moe_skewed", "exposed EP communication")
    with store.connect(db, read_only=True) as con:
        load = dict(con.execute("SELECT rank, sum(bytes) FROM collectives c JOIN device_events e USING (run_id, "
                                "rank, event_id) JOIN step_windows w USING (run_id, rank) WHERE run_id = "
                                "'moe_skewed' AND w.step = 3 AND c.op = 'AllToAll' AND e.start_ns >= w.start_ns "
                                "AND e.start_ns < w.end_ns GROUP BY rank").fetchall())
    assert load == {0: 704 * 1024, 2: 704 * 1024, 1: 320 * 1024, 3: 320 * 1024}
    assert "ranks 0, 2 704 KiB" in row["evidence"] and "ranks 1, 3 320 KiB" in row["evidence"]
    assert f"224 KiB against 32 KiB: {112 / 16:.1f}x the tokens" in row["evidence"]
    assert "waiting for the hot ranks 0, 2" in row["evidence"] and "'straggler ranks 0, 2'" in row["evidence"]
    _finding(db, "moe_skewed", "straggler ranks 0, 2")  # the finding it points at is there


@pytest.mark.parametrize(("spec", "says"), [
    ("speed=2", "expected KEY=VALUE"), ("dim=TP:-1", ">= 0"), ("dim=TP:nan", ">= 0"), ("dim=XX:0.5", "dim is one of"),
    ("rank=*:0.5", "':median'"), ("stage=*:2", "must be a number"), ("rank=5:0.5", "has no rank 5"),
    ("overlap=QQ", "overlap takes a dim"), ("kernel=gemm", "TARGET:FACTOR"),
    ("rank=99:median", "has no rank 99"), ("host=foo:0", "host=capturable:FACTOR"), ("stage=3:median", "stages 0..0"),
    ("pg=nope:0.5", "no process group"), ("link=1-1:2", "two different ranks"), ("link=0-9:2", "has no rank 9"),
    ("link=0:2", "two different ranks"),
])
def test_bad_changes_are_one_line_errors(db: Path, spec: str, says: str) -> None:
    code, _, err = run_main("whatif", "moe_skewed", "--change", spec, "--db", db)
    assert code == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("link", "group"), [("0-4", "9"), ("4-0", "9"), ("0-1", "1")])
def test_a_link_change_is_its_pair_or_the_one_group_holding_both(db: Path, link: str, group: str) -> None:
    """On toy8 (tp2 pp2 dp2) ranks 0 and 4 exchange only their PP messages, in group 9 = [0, 4]; ranks 0 and 1 share
    only TP group 1: a link at half speed must predict what that group at half speed does, rank-step by rank-step."""
    run = "toy8_tp2pp2dp2_1f1b"
    by_link = _whatif(db, run, None, f"link={link}:2").sort("rank", "step")
    by_group = _whatif(db, run, None, f"pg={group}:2").sort("rank", "step")
    assert by_link["predicted_TOTAL_ms"].to_list() == by_group["predicted_TOTAL_ms"].to_list()
    assert (by_link["predicted_TOTAL_ms"] > by_link["TOTAL_ms"]).any()  # the change matters


def test_a_link_without_traffic_names_what_would_have_it(db: Path) -> None:
    code, _, err = run_main("whatif", "toy8_tp2pp2dp2_1f1b", "--change", "link=0-7:2", "--db", db)
    assert code == 2 and "no message between ranks 0 and 7" in err and err.count("\n") == 1


def test_commands_print_json(db: Path) -> None:
    import json

    replayed = json.loads(run_cli("replay", "moe_skewed", "--db", db, "--json").stdout)
    assert replayed["worst_abs_error_pct"] < 1 and replayed["edges"]["gap"] > 0
    predicted = json.loads(run_cli("whatif", "moe_skewed", "--change", "dim=DP:0.5", "--db", db, "--json").stdout)
    assert predicted["predicted_step_ms"] < predicted["measured_step_ms"]
    stage = predicted["stages"][0]  # one stage: the mean of the four ranks
    assert stage["ranks"] == 4 and stage["predicted_TOTAL_ms"] == pytest.approx(
        np.mean([r["predicted_TOTAL_ms"] for r in predicted["ranks"]]))
    assert {"kind", "duration_ms"} <= set(predicted["critical_path_by_kind"][0])
    found = json.loads(run_cli("advise", "moe_skewed", "--db", db, "--json").stdout)
    assert found["findings"] and all(f["evidence"] for f in found["findings"])


def test_advise_checks_a_slow_group_by_scaling_it_to_its_peers(db: Path) -> None:
    """toy8: the comm view's slow links list process groups below their peers' median busbw; advise proposes each
    at its peers' speed (pg=ID:bandwidth/median, the transfer time that bandwidth gives), predicted by what-if."""
    from traceana.analyses.comm import by_group, matrix, slow_links

    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, "toy8_tp2pp2dp2_1f1b")
        slow = slow_links(matrix(con, "toy8_tp2pp2dp2_1f1b"), by_group(con, "toy8_tp2pp2dp2_1f1b"), 20.0)
    groups = slow.filter(pl.col("what") == "group")
    assert groups.height
    for row in groups.iter_rows(named=True):
        pg = row["who"].split()[1]
        proposed = found.filter(pl.col("change").str.starts_with(f"pg={pg}:"))
        assert proposed.height == 1
        assert float(proposed["change"][0].split(":")[1]) == pytest.approx(
            row["bandwidth_GBps"] / row["median_GBps"], abs=1e-3)


def test_advise_checks_a_slow_rank_pair_by_its_link(db: Path) -> None:
    """toy8: the PP messages 4 -> 0 run more than 20% below the median of the PP pairs (comm_matrix, read here by
    SQL): advise proposes link=0-4 at the peers' speed, and its gain is the what-if of that link change."""
    run = "toy8_tp2pp2dp2_1f1b"
    with store.connect(db, read_only=True) as con:
        step, found = advise.findings(con, run)
        pairs = con.execute("SELECT src, dst, GBps, median(GBps) OVER () FROM comm_matrix WHERE run_id = ? "
                            "AND dim = 'PP' ORDER BY GBps", [run]).fetchall()
    src, dst, slowest, median = pairs[0]
    assert slowest < 0.8 * median and {src, dst} == {0, 4}
    (row,) = found.filter(pl.col("finding") == "slow link 0-4").iter_rows(named=True)
    assert row["change"] == f"link=0-4:{slowest / median:.3f}"
    predicted = _step_ms(_whatif(db, run, step, row["change"]), "predicted_TOTAL_ms")
    assert row["predicted_step_ms"] == pytest.approx(predicted[step], rel=1e-6)


def test_advise_without_a_config_infers_it_and_gates_micro_batches_by_memory(db: Path) -> None:
    """h200_gpt without --config: advise infers the job as `predict` does (2 micro-batches of 2 a step); its memory
    peak (7.0 GB of the H200's 141 GB, the memory table's maximum by SQL) leaves room, so larger micro-batches are a
    finding, priced by predict: `traceana predict --set parallel.micro_batch=4` gives the same step and interval."""
    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, "h200_gpt")
        peak = con.execute("SELECT max(greatest(allocated_bytes, coalesce(reserved_bytes, 0))) / 1e9 FROM memory "
                           "WHERE run_id = 'h200_gpt'").fetchone()[0]
    row = found.filter(pl.col("finding") == "memory headroom: larger micro-batches").row(0, named=True)
    assert row["change"] == "parallel.micro_batch=4" and f"peak {peak:.1f} GB of 141 GB" in row["evidence"]
    assert "config inferred from the trace" in row["evidence"]
    code, out, err = run_main("predict", "h200_gpt", "--set", "parallel.micro_batch=4", "--json", "--db", db)
    assert code == 0, err
    (total,) = [r for r in json.loads(out)["step"] if r["dim"] == "TOTAL"]
    scale = row["measured_step_ms"] / total["measured_A_ms"]
    for ours, theirs in (("predicted_step_ms", "predicted_B_ms"), ("low", "low"), ("high", "high")):
        assert row[ours] == pytest.approx(total[theirs] * scale, rel=1e-9)
    with store.connect(db, read_only=True) as con:  # a run whose job cannot be inferred keeps the graph's findings
        _, found = advise.findings(con, "h200_hostbound")
    assert not found.filter(pl.col("graph").str.starts_with("predict")).height


def test_advise_with_a_config_prices_the_estimators_candidates_by_predict(db: Path) -> None:
    """toy8 (pp=2, 1F1B) with its estimator config: schedule and layout candidates are priced by predict (the
    estimator only screens them), each change written as the `--set` arguments that make it, so every such finding
    equals what `traceana predict --set CHANGE` says, scaled from predict's step (the stages' mean over the run) to
    advise's (the median rank of the step)."""
    from tests.conftest import ROOT

    cfg = ROOT / "sample_traces" / "configs" / "toy8_tp2pp2dp2_1f1b.yaml"
    with store.connect(db, read_only=True) as con:
        _, found = advise.findings(con, "toy8_tp2pp2dp2_1f1b", config_path=str(cfg))
    by_predict = found.filter(pl.col("graph").str.starts_with("predict"))
    assert {"pipeline bubble: schedule zb-h1", "a faster layout"} <= set(by_predict["finding"])
    changes = dict(by_predict.select("finding", "change").iter_rows())
    assert changes["pipeline bubble: schedule zb-h1"] == "schedule.kind=zb-h1"
    for row in by_predict.iter_rows(named=True):
        sets = [arg for spec in row["change"].split() for arg in ("--set", spec)]
        code, out, err = run_main("predict", "toy8_tp2pp2dp2_1f1b", "--config", cfg, *sets, "--json", "--db", db)
        assert code == 0, err
        (total,) = [r for r in json.loads(out)["step"] if r["dim"] == "TOTAL"]
        scale = row["measured_step_ms"] / total["measured_A_ms"]
        for ours, theirs in (("predicted_step_ms", "predicted_B_ms"), ("low", "low"), ("high", "high")):
            assert row[ours] == pytest.approx(total[theirs] * scale, rel=1e-9), row["change"]
    assert (by_predict["gain_ms"] > 0).all()
    keys = list(zip(found["gain_ms"] > 0, found["gain_low_ms"], strict=True))  # a gain first, by its lower end
    assert keys == sorted(keys, reverse=True)
    assert (found["low"] <= found["predicted_step_ms"]).all() and (found["predicted_step_ms"] <= found["high"]).all()


@pytest.mark.parametrize("command", [["replay"], ["whatif", "--change", "host=0"], ["advise"]])
def test_a_step_the_run_lacks_is_a_one_line_error(db: Path, command: list[str]) -> None:
    code, _, err = run_main(*command, "moe_skewed", "--step", "99", "--db", db)
    assert code == 2 and err == "error: --step 99: run 'moe_skewed' has no such step (steps: 2, 3)\n"


SYNTH_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "synth_gpt_tp2pp2.yaml"
SYNTH_RUNS = {"base": [], "slow_rank": ["--straggler-rank", "5", "--slowdown", "2"],
              "slow_stage": ["--straggler-stage", "0", "--slowdown", "2"], "tp_halved": ["--comm-scale", "TP=2"]}


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16-rank GPT runs (tp2 dp4 pp2, 1F1B) synthesized with the same seed: as planned, with rank 5's compute twice as
    long, with stage 0's twice as long, with TP transfers twice as long (half the TP bandwidth), and the truth for
    ``stage=0:median``: stage 0 slowed to the other stage's mean COMP (stage 1 carries the output layer and the loss,
    so that balance point is not the plan)."""
    root = tmp_path_factory.mktemp("synth")
    db = root / "synth.duckdb"
    runs = dict(SYNTH_RUNS)
    for run, options in runs.items():
        run_cli("synth", SYNTH_CONFIG, root / run, "--ranks", 16, "--steps", 3, "--seed", 1, *options)
        run_cli("ingest", root / run / "traces", "--db", db, "--run-id", run, "--layout", "tp=2,dp=4,pp=2")
    truth = json.loads((root / "base" / "truth.json").read_text())
    stage = {r["rank"]: r["pp"] for r in truth["ranks"]}
    comp = pl.DataFrame(truth["steps"]).with_columns(pl.col("rank").replace_strict(stage).alias("pp"))
    means = dict(comp.group_by("pp").agg(pl.col("COMP_ns").mean()).iter_rows())
    run_cli("synth", SYNTH_CONFIG, root / "stage_balanced", "--ranks", 16, "--steps", 3, "--seed", 1,
            "--straggler-stage", 0, "--slowdown", means[1] / means[0])
    run_cli("ingest", root / "stage_balanced" / "traces", "--db", db, "--run-id", "stage_balanced", "--layout",
            "tp=2,dp=4,pp=2")
    return db


def _step_ms(frame: pl.DataFrame, column: str) -> dict[int, float]:
    """The step's time per step: the median rank's TOTAL (the hosts start every step together)."""
    return dict(frame.group_by("step").agg(pl.col(column).median()).sort("step").iter_rows())


@pytest.mark.long
@pytest.mark.parametrize(("run", "change", "truth"), [
    ("slow_rank", "rank=5:median", "base"), ("slow_stage", "stage=0:median", "stage_balanced"),
    ("base", "dim=TP:2", "tp_halved"), ("tp_halved", "dim=TP:0.5", "base"),
])
def test_whatif_predicts_the_run_synthesized_without_the_change(synthesized: Path, run: str, change: str,
                                                                truth: str) -> None:
    """The truth is the run synthesized with the same seed and the change made in the plan; both are read from
    their traces, so this checks the graph end to end (launches running ahead, the step-end sync and barrier,
    transfers posted a step early)."""
    predicted = _step_ms(_whatif(synthesized, run, None, change), "predicted_TOTAL_ms")
    true = _step_ms(_replayed(synthesized, truth), "TOTAL_ms")
    measured = _step_ms(_replayed(synthesized, run), "TOTAL_ms")
    for step, ms in true.items():
        assert abs(measured[step] - ms) > 0.08 * ms  # the change matters ...
        assert abs(predicted[step] - ms) <= 0.03 * ms, (step, measured[step], predicted[step], ms)  # ... and is seen


@pytest.mark.long
def test_synthesized_runs_replay_and_the_barrier_is_found(synthesized: Path) -> None:
    for run in SYNTH_RUNS:
        frame = _replayed(synthesized, run)
        assert frame["error_pct"].abs().max() <= 1.0
    with store.connect(synthesized, read_only=True) as con:
        g = replay.replay_run(con, "slow_rank")[0]
    assert g.counts["barrier"] == 2 and g.counts["host_wait"] == 48  # 3 steps: 2 boundaries; a sync per rank-step


@pytest.mark.long
def test_advise_names_the_slow_stage_of_a_synthesized_run_first(synthesized: Path) -> None:
    with store.connect(synthesized, read_only=True) as con:
        _, found = advise.findings(con, "slow_stage")
    first = found.row(0, named=True)
    assert first["finding"] == "straggler stage 0" and first["change"] == "stage=0:median"
    truth = _step_ms(_replayed(synthesized, "stage_balanced"), "TOTAL_ms")[1]
    assert abs(first["predicted_step_ms"] - truth) <= 0.03 * truth  # what the stage would take, balanced


@pytest.mark.parametrize("run", [*SHARED_RUNS, *SAMPLE_RUNS])
def test_both_walks_give_every_node_the_same_time(db: Path, run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The longest path walked node by node (narrow graphs) and level by level (from replay.WIDE ranks) agree to the
    ns on every real graph, as measured and with a what-if's edit (weights halved, every seventh edge dropped); the
    edges an edit drops (led to a node of their own) are as good as gone from the graph."""
    import dataclasses

    from traceana.model import graph as dependency

    with store.connect(db, read_only=True) as con:
        g = dependency.build(con, run)
    edit = {"weight": g.weight // 2, "keep": np.arange(len(g.src)) % 7 != 3}
    without = dataclasses.replace(g, src=g.src[edit["keep"]], dst=g.dst[edit["keep"]],
                                  weight=edit["weight"][edit["keep"]])
    walked = []
    for wide in (0, 10 ** 9):
        monkeypatch.setattr(replay, "WIDE", wide)
        walked.append((replay.longest_path(g), replay.longest_path(g, **edit), replay.longest_path(without)))
    assert all(np.array_equal(a, b) for a, b in zip(*walked, strict=True))
    assert not np.array_equal(*walked[0][:2])  # the edit moved something
    assert np.array_equal(walked[0][1], walked[0][2])


# hta_rank0of16 has events begun before the step that run into it; moe_skewed, six findings on four CPU ranks
@pytest.mark.parametrize("run", ["moe_skewed", "hta_rank0of16"])
def test_advise_prices_its_step_from_the_events_that_meet_it(db: Path, run: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """advise measures its one step of each replayed change from the events that touch that step's windows only:
    the same findings, predictions and intervals as from every event of the run."""
    columns = ["change", "predicted_step_ms", "low", "high", "gain_ms"]
    with store.connect(db, read_only=True) as con:
        _, kept = advise.findings(con, run)
        monkeypatch.setattr(replay, "meets", lambda events, windows: np.ones(events.height, bool))
        _, every = advise.findings(con, run)
    assert kept.height > 0
    assert kept.select(columns).equals(every.select(columns))


@pytest.mark.parametrize("wide", [0, 10 ** 9])
def test_a_graph_whose_nodes_wait_on_each_other_is_a_one_line_error(wide: int, monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    """Instances matched in an order the ranks did not run them could close a cycle; the replay then says so
    instead of returning times for half the graph (either walk)."""
    from traceana.errors import TraceanaError
    from traceana.model.graph import RUN, Graph

    monkeypatch.setattr(replay, "WIDE", wide)

    cycle = Graph("r", pl.DataFrame(), pl.DataFrame(), n_nodes=3, src=np.array([0, 1, 2]), dst=np.array([1, 2, 1]),
                  weight=np.zeros(3, np.int64), kind=np.full(3, RUN, np.int8), event=np.full(3, -1),
                  roots=np.array([0]), root_ns=np.array([0]))
    with pytest.raises(TraceanaError, match=r"run 'r': 2 nodes of its dependency graph wait on each other"):
        replay.longest_path(cycle)


def test_a_stream_carried_into_the_first_step_is_anchored_to_the_nanosecond(db: Path) -> None:
    """hta_rank0of16's streams were busy before its first window (epoch-scale ns): the first event of each such
    stream follows the rank's root by exactly (the stream's last end before the window - the window's start),
    both taken from the store by SQL. Through a float64, as before, these were off by up to 128 ns."""
    from traceana.model import graph as dependency

    with store.connect(db, read_only=True) as con:
        g = dependency.build(con, "hta_rank0of16")
        expected = con.sql(f"""
            WITH c AS ({dependency.CARRIED_SQL}),
                 f AS (SELECT rank, min(start_ns) AS first_ns FROM step_windows WHERE run_id = $run GROUP BY rank)
            SELECT c.rank, c.stream, c.busy_until_ns - f.first_ns AS offset_ns FROM c JOIN f USING (rank)""",
                           params={"run": "hta_rank0of16"}).pl()
    heads = g.events.with_row_index("i").group_by("rank", "stream").agg(pl.col("i").first())
    anchors = pl.DataFrame({"i": g.dst, "offset_ns": g.weight, "kind": g.kind, "src": g.src}).filter(
        (pl.col("kind") == dependency.ANCHOR) & pl.col("src").is_in(g.roots.tolist())).cast({"i": pl.UInt32})
    got = (heads.join(expected, on=["rank", "stream"]).join(anchors, on="i", suffix="_graph")
           .group_by("rank", "stream").agg((pl.col("offset_ns_graph") == pl.col("offset_ns")).any().alias("exact")))
    assert got.height == expected.height > 0  # (an event begun before the window has its own anchor beside it)
    assert got["exact"].all()
    assert (expected["offset_ns"] % 1000 == 0).all()  # the trace's µs: a rounded offset would not be


def test_the_latest_end_before_each_start_is_duckdbs_asof_match(db: Path) -> None:
    """What held a start (graph._latest_end_before, a binary search per rank) equals DuckDB's ASOF join of the
    same on toy8's events, ties in end (which the ASOF join breaks either way) aside."""
    import duckdb

    from traceana.model import graph as dependency

    with store.connect(db, read_only=True) as con:
        ev = dependency.build(con, "toy8_tp2pp2dp2_1f1b").events
    rank, start, end = ev["rank"].to_numpy(), ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    found = dependency._latest_end_before(rank, start, rank, end, start)
    starts = pl.DataFrame({"i": np.arange(len(rank)), "rank": rank, "t": start})  # noqa: F841 - read by DuckDB
    ends = pl.DataFrame({"j": np.arange(len(end)), "rank": rank, "t": end}).filter(pl.Series(end > start))  # noqa
    asof = duckdb.sql("SELECT s.i, e.t FROM starts s ASOF LEFT JOIN ends e ON s.rank = e.rank AND s.t >= e.t "
                      "ORDER BY s.i").pl()["t"].to_numpy()
    assert (found >= 0).sum() > 0.9 * len(rank)
    assert np.array_equal(np.where(found >= 0, end[np.maximum(found, 0)], -1), np.nan_to_num(asof, nan=-1))


def test_host_gaps_keep_the_traces_microseconds(db: Path) -> None:
    """hta_rank0of16 is a µs trace on an epoch clock whose device events are not all launched: the host gaps
    between its launches are differences of two timestamps, so whole µs. Read through a float64 (the launch
    column with its nulls), they came out as 33,024 or 18,944 ns, and 1,048 starts were taken as held."""
    from traceana.model import graph as dependency

    with store.connect(db, read_only=True) as con:
        g = dependency.build(con, "hta_rank0of16")
        nulls = con.sql("SELECT count(*) FILTER (WHERE launch_ns IS NULL) FROM device_events WHERE run_id = ?",
                        params=["hta_rank0of16"]).fetchall()[0][0]
    host = g.weight[g.kind == dependency.HOST]
    assert nulls > 0 and len(host) > 1000
    assert (host % 1000 == 0).all()
