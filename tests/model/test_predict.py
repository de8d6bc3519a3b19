"""`traceana predict` on the sample pairs (real gloo CPU runs): every predicted part recomputed by hand from
`traceana breakdown --json` of the source run and the estimator's stage fields (the routing pairs, which replay the
run's graph, from `traceana whatif --json` with per-rank factors found by hand), the pipeline's step by hand for
GPipe with one micro-batch, the error bar from `traceana replay --json`, the miss against the target run's own
`traceana breakdown --json`; bad input as one line and exit 2."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from tests.conftest import SAMPLES, add_run, run_cli
from tests.test_sample_traces import RECORDED
from traceana import store
from traceana.api import Traces
from traceana.estimator import config
from traceana.estimator.estimate import estimate

CONFIGS = SAMPLES.parent / "configs"
PAIRS = [("pp2_mb1", "pp2_mb8"), ("tp2dp2_mlp", "tp2dp2_mlp_sp"), ("moe_balanced", "moe_skewed")]
SCALED = {"COMP": "comp", "MP_WAIT": "mp_wait", "CP_WAIT": "cp_wait", "EP_WAIT": "ep_wait", "DP_WAIT": "dp_wait"}
TOY = "toy8_tp2pp2dp2_1f1b"  # the one sample that recorded memory
WORK = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "OTHER_WAIT", "IDLE")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pairs' runs, ingested with their layouts as `traceana ingest DIR --layout SPEC` stores them."""
    path = tmp_path_factory.mktemp("predict") / "pairs.duckdb"
    with store.connect(path) as con:
        for name in sorted({n for pair in PAIRS for n in pair} | {TOY}):
            add_run(con, name, [SAMPLES / name], "kineto", RECORDED[name][0])
    return path


def run_hardware(db: Path, run: str, cfg: config.Config) -> config.Hardware:
    """The run's own links, by hand: every sample ran on gloo, and every sample group has 2 ranks, so an
    all-reduce is 2 ring steps with its whole buffer on the bus. Where the run's non-PP all-reduces have exactly
    two sizes, the two mean transfer times (last arrival to end) solve 2 alpha + bytes / bandwidth exactly; with
    one size the config's links stay."""
    with duckdb.connect(str(db), read_only=True) as con:
        sizes = con.execute(
            "SELECT bytes, avg(ns) FROM (SELECT i.instance, max(c.bytes) AS bytes, "
            "any_value(i.last_end_ns - i.last_start_ns) AS ns FROM collective_instances i "
            "JOIN collectives c USING (run_id, instance) WHERE i.run_id = ? AND c.kernel_op = 'AllReduce' "
            "AND c.dim <> 'PP' AND i.ranks_seen > 1 GROUP BY i.instance) GROUP BY bytes ORDER BY bytes",
            [run]).fetchall()
    hardware = replace(cfg.hardware, collectives="gloo")
    if len(sizes) != 2:
        return hardware
    (s1, t1), (s2, t2) = sizes
    per_byte = (t2 - t1) / (s2 - s1)  # ns a byte
    alpha_us, gbps = (t1 - s1 * per_byte) / 2 / 1e3, 1 / per_byte
    return replace(hardware, latency_us=config.Links(alpha_us, alpha_us), bandwidth_gb_per_s=config.Links(gbps, gbps))


def predict_json(db: Path, run: str, cfg: Path, target: Path) -> dict:
    return json.loads(run_cli("predict", run, "--config", cfg, "--to", target, "--json", "--db", db).stdout)


def breakdown(db: Path, run: str, by: str) -> list[dict]:
    return json.loads(run_cli("breakdown", run, "--by", by, "--json", "--db", db).stdout)


def rows_of(out: dict, part: str = "stages") -> dict[tuple[int, str], dict]:
    return {(r.get("stage", 0), r["dim"]): r for r in out[part]}


@pytest.mark.parametrize(("a", "b"), PAIRS[:2])  # moe's routing change replays the run's graph (below)
def test_each_part_is_the_measured_part_times_the_estimators_ratio(db: Path, a: str, b: str) -> None:
    out = predict_json(db, a, CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml")
    got = rows_of(out)
    cfg_a, cfg_b = config.load(CONFIGS / f"{a}.yaml"), config.load(CONFIGS / f"{b}.yaml")
    hardware = run_hardware(db, a, cfg_a)  # the ratios price communication with the run's own links
    est_a, est_b = estimate(replace(cfg_a, hardware=hardware)), estimate(replace(cfg_b, hardware=hardware))
    scratch = estimate(cfg_b)
    work_a, tails = [], []
    for stage in breakdown(db, a, "stage"):
        s = stage["pp"] or 0
        mean = {d: stage[f"{d}_mean_ms"] for d in (*WORK, "DP_WAIT", "PP_WAIT", "TOTAL")}
        for dim, attr in SCALED.items():
            before, after = getattr(est_a.stages[s], attr), getattr(est_b.stages[s], attr)
            expected = mean[dim] * after / before if before else mean[dim]  # the CPU configs model every dim used
            assert got[s, dim]["measured_A_ms"] == pytest.approx(mean[dim], rel=1e-9)
            assert got[s, dim]["predicted_B_ms"] == pytest.approx(expected, rel=1e-9), dim
            assert got[s, dim]["estimated_B_ms"] == pytest.approx(getattr(scratch.stages[s], attr) * 1e3, rel=1e-9)
        # the CPU configs model no host time, so IDLE goes with the layer passes the host issues
        passes = cfg_b.micro_batches * est_b.stages[s].layers / (cfg_a.micro_batches * est_a.stages[s].layers)
        assert got[s, "IDLE"]["predicted_B_ms"] == pytest.approx(mean["IDLE"] * passes, rel=1e-9)
        # the step scaled as the simulated schedule scales; PP_WAIT what it leaves over the other parts (none, and
        # the step no shorter than they are, where the parts alone exceed it)
        scaled = mean["TOTAL"] * out["schedule"]["target_ms"] / out["schedule"]["source_ms"]
        rest = sum(got[s, d]["predicted_B_ms"] for d in (*WORK, "DP_WAIT"))
        assert got[s, "PP_WAIT"]["predicted_B_ms"] == pytest.approx(max(0.0, scaled - rest), rel=1e-9, abs=1e-12)
        assert got[s, "TOTAL"]["predicted_B_ms"] == pytest.approx(max(scaled, rest), rel=1e-9)
        work_a.append(sum(mean[d] for d in WORK) / cfg_a.micro_batches)
        tails.append(mean["DP_WAIT"])
    if cfg_a.parallel.pp == 1:  # one stage, one micro-batch: the step is the parts, as measured
        assert out["schedule"]["source_ms"] == pytest.approx(sum(work_a) + max(tails), rel=1e-9)
    else:  # GPipe with one micro-batch runs serially: both stages' work and two transfers, then the DP tail
        assert cfg_a.schedule.kind == "gpipe" and cfg_a.micro_batches == 1
        assert out["schedule"]["source_ms"] == pytest.approx(
            sum(work_a) + 2 * out["schedule"]["p2p_source_ms"] + max(tails), rel=1e-9)


def gemm_ms_in_step(trace: Path, step: int) -> float:
    """A rank's matrix products in one step, read from its raw trace: the main thread's outermost aten::mm /
    aten::linear calls inside ProfilerStep#step (a product inside another counts once)."""
    with gzip.open(trace) as handle:
        events = json.load(handle)["traceEvents"]
    window = next(e for e in events if e.get("name") == f"ProfilerStep#{step}")
    start, end = window["ts"], window["ts"] + window["dur"]
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["tid"] == window["tid"]
                   and e["name"] in ("aten::mm", "aten::addmm", "aten::linear") and start <= e["ts"] < end)
    total, last = 0.0, -math.inf
    for begin, finish in calls:
        if begin >= last:
            total, last = total + finish - begin, finish
    return total / 1e3


def test_a_routing_skew_replays_the_runs_graph_with_each_ranks_own_compute(db: Path) -> None:
    """moe_balanced -> moe_skewed changes only the routing (model.expert_load [1.75, 0.25]): the same ops in the
    same order, so the run's graph is replayed with per-rank compute. The factors by a second route: each rank's
    matrix products from its raw trace over its COMP (`breakdown --by rank`), times the FLOP ratio of the stage's
    products at 1.75 (or 0.25) x a balanced expert share (the expert's two 512 x 2048 GEMMs over 64 tokens beside
    the config's 2-expert router and 8-word output layer), the rest of its compute (bucket copies, SGD) left as
    measured; its estimated EP wait is the all-to-all alone; the replay is `traceana whatif` with those changes,
    over the typical step (3)."""
    out = predict_json(db, "moe_balanced", CONFIGS / "moe_balanced.yaml", CONFIGS / "moe_skewed.yaml")
    base = config.load(CONFIGS / "moe_balanced.yaml")
    hardware = replace(base.hardware, collectives="gloo")  # one all-reduce size: the config's links stay

    def at(capacity: float):  # type: ignore[no-untyped-def]
        return estimate(replace(base, hardware=hardware, model=replace(base.model, capacity_factor=capacity)))

    balanced, hot = at(1.0), at(1.75)
    expert, fixed = 64 * 2 * 512 * 2048, 64 * 512 * (8 + 2)  # multiply-adds a micro-batch: the experts'; the
    product_ratio = {e: (load * expert + fixed) / (expert + fixed) for e, load in enumerate((1.75, 0.25))}  # rest
    comp = {r["rank"]: (r["ep"], r["COMP_ms"]) for r in breakdown(db, "moe_balanced", "rank")}
    share = {r: gemm_ms_in_step(SAMPLES / "moe_balanced" / f"rank{r}.json.gz", 3) / ms for r, (_, ms) in comp.items()}
    assert all(0.5 < x < 0.85 for x in share.values())  # a third of a rank's compute is not its products (cat, SGD)
    factors = {r: 1 + share[r] * (product_ratio[e] - 1) for r, (e, _) in comp.items()}
    ep = hot.stages[0].ep_wait / balanced.stages[0].ep_wait
    changes = [c for r, f in factors.items() for c in ("--change", f"rank={r}:{f!r}")]
    whatif = json.loads(run_cli("whatif", "moe_balanced", *changes, "--change", f"dim=EP:{ep!r}", "--json",
                                "--db", db).stdout)
    ranks = [r for r in whatif["ranks"] if r["step"] == 3]
    got = rows_of(out)
    for dim in ("COMP", "EP_WAIT", "DP_WAIT", "IDLE", "TOTAL"):
        expected = np.mean([r[f"predicted_{dim}_ms"] for r in ranks])
        assert got[0, dim]["predicted_B_ms"] == pytest.approx(expected, rel=1e-6), dim
        assert got[0, dim]["source"].startswith("trace replayed")
    path = next(n for n in out["notes"] if n.startswith("path: the run's dependency graph replayed"))
    assert "; ".join(f"rank {r}: {factors[r]:.3f}" for r in range(4)) in path and f"times {ep:.3f}" in path
    assert out["schedule"] == {} and not any("expert_load" in n for n in out["notes"])
    # the hot ranks' extra compute fills what was their EP wait, so the step grows far less than their compute
    hot_growth = np.mean([r["predicted_COMP_ms"] - r["COMP_ms"] for r in ranks if r["rank"] in (0, 2)])
    assert 0 < got[0, "TOTAL"]["predicted_B_ms"] - got[0, "TOTAL"]["measured_A_ms"] < hot_growth


def test_a_run_at_two_loads_prices_each_rank_by_its_own_load_curve(db: Path) -> None:
    """moe_skewed -> moe_balanced: the skewed run computed at loads 1.75 (ranks 0, 2) and 0.25 (1, 3), so its own
    COMP per rank on load (`breakdown --by rank --json`, a line through the four) prices each rank at load 1, in
    place of the FLOP ratio that a 16-token GEMM does not follow; replayed as `traceana whatif` replays it."""
    out = predict_json(db, "moe_skewed", CONFIGS / "moe_skewed.yaml", CONFIGS / "moe_balanced.yaml")
    ranks = breakdown(db, "moe_skewed", "rank")
    load = {0: 1.75, 1: 0.25}
    per_load, fixed = map(float, np.polyfit([load[r["ep"]] for r in ranks], [r["COMP_ms"] for r in ranks], 1))
    assert 10 < fixed < 15 and 12 < per_load < 16  # 12.7 ms + 14.0 ms x load: at load 1 26.7, near the balanced 26.2
    factors = {r["rank"]: (fixed + per_load) / (fixed + per_load * load[r["ep"]]) for r in ranks}
    base = config.load(CONFIGS / "moe_balanced.yaml")
    hardware = replace(base.hardware, collectives="gloo")
    hot = replace(base, hardware=hardware, model=replace(base.model, capacity_factor=1.75))
    ep = estimate(replace(base, hardware=hardware)).stages[0].ep_wait / estimate(hot).stages[0].ep_wait
    changes = [c for r, f in factors.items() for c in ("--change", f"rank={r}:{f!r}")]
    whatif = json.loads(run_cli("whatif", "moe_skewed", *changes, "--change", f"dim=EP:{ep!r}", "--json",
                                "--db", db).stdout)
    replayed = [r for r in whatif["ranks"] if r["step"] == 3]
    got = rows_of(out)
    for dim in ("COMP", "EP_WAIT", "DP_WAIT", "TOTAL"):
        expected = np.mean([r[f"predicted_{dim}_ms"] for r in replayed])
        assert got[0, dim]["predicted_B_ms"] == pytest.approx(expected, rel=1e-6), dim
    assert got[0, "COMP"]["source"] == "trace replayed × run load curve per rank"
    assert (f"compute on stage 0: the run's own COMP per rank on its EP rank's load, {fixed:.3f} ms + {per_load:.3f} "
            "ms x load (least squares over 4 ranks), prices each rank's ratio") in out["notes"]


def test_communication_is_priced_with_the_runs_own_links_and_backend(db: Path) -> None:
    out = predict_json(db, "tp2dp2_mlp", CONFIGS / "tp2dp2_mlp.yaml", CONFIGS / "tp2dp2_mlp_sp.yaml")
    hardware = run_hardware(db, "tp2dp2_mlp", config.load(CONFIGS / "tp2dp2_mlp.yaml"))
    assert any(n.startswith("collectives: the run ran them on gloo") for n in out["notes"])
    assert (f"links intra: the run's own alpha-beta over its 16 collectives of 2 sizes, "
            f"{hardware.latency_us.intra:.1f} µs a ring step and {hardware.bandwidth_gb_per_s.intra:.3f} GB/s of bus "
            "bandwidth (the config says 164.9 µs, 1.388 GB/s)") in out["notes"]
    assert hardware.latency_us.intra > 1000  # 4 ranks on 2 cores: a ring step costs a descheduled worker's wake-up
    # gloo has no reduce-scatter: sequence parallelism adds the all-gathers to all-reduces of the same size
    est_a = estimate(replace(config.load(CONFIGS / "tp2dp2_mlp.yaml"), hardware=hardware))
    est_b = estimate(replace(config.load(CONFIGS / "tp2dp2_mlp_sp.yaml"), hardware=hardware))
    assert est_b.stages[0].mp_wait > 1.3 * est_a.stages[0].mp_wait
    # one all-reduce size: nothing to fit the latency apart from the bandwidth, so the config's links stay
    out = predict_json(db, "pp2_mb1", CONFIGS / "pp2_mb1.yaml", CONFIGS / "pp2_mb8.yaml")
    assert ("links intra: the run's 4 collectives of 1 size(s) fit no positive alpha-beta, so the config's 164.9 µs "
            "and 1.388 GB/s price them") in out["notes"]


def test_the_run_itself_is_predicted_as_measured(db: Path) -> None:
    # every ratio 1 and the schedule simulated twice alike: each stage's parts are its breakdown's
    out = predict_json(db, TOY, CONFIGS / f"{TOY}.yaml", CONFIGS / f"{TOY}.yaml")
    got = rows_of(out)
    for stage in breakdown(db, TOY, "stage"):
        for dim in ("COMP", "MP_WAIT", "DP_WAIT", "PP_WAIT", "IDLE", "TOTAL"):
            assert got[stage["pp"], dim]["predicted_B_ms"] == pytest.approx(stage[f"{dim}_mean_ms"], rel=1e-9), dim
    assert out["schedule"]["target_ms"] == pytest.approx(out["schedule"]["source_ms"], rel=1e-12)
    assert not any(" → " in n and "no trace evidence" in n for n in out["notes"])


def test_gloo_transfers_are_rendezvous_when_the_schedule_replays_a_run(db: Path, tmp_path: Path) -> None:
    """pp2_mb8 fed its own stage times and transfer time: its gloo sends wait for their receivers, so the schedule
    played with rendezvous transfers comes near the measured step (53.2 ms against 58.0) where fire-and-forget
    sends fall far short (44.4 ms); the measured step by hand from `breakdown --by rank --json`."""
    run, cfg = "pp2_mb8", CONFIGS / "pp2_mb8.yaml"
    measured = np.mean([r["TOTAL_ms"] for r in breakdown(db, run, "rank")])
    raw = yaml.safe_load(cfg.read_text())
    fire_and_forget = tmp_path / "async.yaml"
    fire_and_forget.write_text(yaml.safe_dump({**raw, "schedule": {**raw["schedule"], "p2p": "async"}}))
    blocking = predict_json(db, run, cfg, cfg)["schedule"]["source_ms"]
    plain = predict_json(db, run, fire_and_forget, fire_and_forget)["schedule"]["source_ms"]
    assert abs(blocking / measured - 1) < 0.10 < 0.20 < abs(plain / measured - 1)


def test_the_error_bar_is_the_replay_residual_and_the_runs_own_spread(db: Path) -> None:
    a, b = PAIRS[2]
    out = predict_json(db, a, CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml")
    rank_steps = json.loads(run_cli("replay", a, "--json", "--db", db).stdout)["rank_steps"]
    rms = math.sqrt(np.mean([r["error_pct"] ** 2 for r in rank_steps]))
    for (stage, dim), row in rows_of(out).items():
        values = np.array([r[f"{dim}_ms"] for r in rank_steps if (r["stage"] or 0) == stage])
        cv = values.std(ddof=1) / values.mean() if values.mean() else 0.0
        assert row["error_bar_ms"] == pytest.approx(abs(row["predicted_B_ms"]) * math.hypot(rms / 100, cv),
                                                    rel=1e-6), dim
    assert any(f"replay residual {rms:.1f}%" in n for n in out["notes"])


def test_the_sample_pairs_against_the_target_runs_breakdown(db: Path) -> None:
    """The validation, against `traceana breakdown B --json` (mean over ranks of the typical step). The miss on
    every pair is in the README; what holds: on pp2 and moe the prediction is nearer than the estimate from
    scratch, and pp2's miss lies within the error bar; tp2dp2_mlp -> _sp, priced as gloo runs it (a ReduceScatter
    as a whole AllReduce, beside the AllGather) with the run's own links, is within 15% and its error bar."""
    misses = {}
    for a, b in PAIRS:
        step = rows_of(predict_json(db, a, CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml"), "step")[0, "TOTAL"]
        measured = np.mean([r["TOTAL_ms"] for r in breakdown(db, b, "rank")])
        scratch = estimate(config.load(CONFIGS / f"{b}.yaml")).step_s * 1e3
        assert step["estimated_B_ms"] == pytest.approx(scratch, rel=1e-9)
        misses[a] = (step["predicted_B_ms"] - measured, scratch - measured, step["error_bar_ms"])
    for run in ("pp2_mb1", "moe_balanced"):
        predicted, scratch, _ = misses[run]
        assert abs(predicted) < abs(scratch), run
    predicted, _, bar = misses["pp2_mb1"]
    assert 0 < abs(predicted) <= bar
    predicted, _, bar = misses["tp2dp2_mlp"]
    measured = np.mean([r["TOTAL_ms"] for r in breakdown(db, "tp2dp2_mlp_sp", "rank")])
    assert abs(predicted) <= min(0.15 * measured, bar)


def test_memory_is_the_measured_peak_times_the_estimators_ratio(db: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load((CONFIGS / f"{TOY}.yaml").read_text())
    raw["parallel"]["global_batch"] *= 2  # 8 micro-batches instead of 4
    target = tmp_path / "toy8_mb8.yaml"
    target.write_text(yaml.safe_dump(raw))
    out = predict_json(db, TOY, CONFIGS / f"{TOY}.yaml", target)
    peaks = json.loads(run_cli("memory", TOY, "--json", "--db", db).stdout)
    measured = max(r["peak_allocated_bytes"] for r in peaks) / 2**20
    est_a, est_b = estimate(config.load(CONFIGS / f"{TOY}.yaml")), estimate(config.load(target))
    memory = out["memory"]
    assert memory["measured_A_MiB"] == pytest.approx(measured, rel=1e-9)
    assert memory["predicted_B_MiB"] == pytest.approx(measured * est_b.peak_memory / est_a.peak_memory, rel=1e-9)
    miss = abs(est_a.peak_memory / 2**20 / measured - 1)  # the estimator's own miss on the run's peak
    assert memory["error_bar_MiB"] == pytest.approx(miss * memory["predicted_B_MiB"], rel=1e-9) and miss > 0
    # no memory samples: the estimator's peak, said so
    out = predict_json(db, "pp2_mb1", CONFIGS / "pp2_mb1.yaml", CONFIGS / "pp2_mb8.yaml")
    assert out["memory"]["source"] == "estimator" and out["memory"]["error_bar_MiB"] is None
    assert "memory: the run sampled no memory, so the peak is the estimator's alone" in out["notes"]


def test_what_the_trace_cannot_inform_is_noted(db: Path, tmp_path: Path) -> None:
    # another model: twice the layers of the MoE block
    raw = yaml.safe_load((CONFIGS / "moe_balanced.yaml").read_text())
    raw["model"]["layers"] = 2
    target = tmp_path / "moe_2layers.yaml"
    target.write_text(yaml.safe_dump(raw))
    out = predict_json(db, "moe_balanced", CONFIGS / "moe_balanced.yaml", target)
    assert "model.layers 1 → 2: per-layer times scaled by the estimator's FLOP ratio, no trace evidence" in out["notes"]
    # a dim the run did not use: tensor parallel inside each pipeline stage of pp2_mb1
    raw = yaml.safe_load((CONFIGS / "pp2_mb1.yaml").read_text())
    raw["parallel"].update(tp=2, dp=1)
    raw["model"]["heads"] = 2  # tp must divide the heads (the stages have no attention either way)
    target = tmp_path / "pp2_tp2.yaml"
    target.write_text(yaml.safe_dump(raw))
    out = predict_json(db, "pp2_mb1", CONFIGS / "pp2_mb1.yaml", target)
    tp = rows_of(out)[0, "MP_WAIT"]
    assert tp["source"] == "estimator (run has none)" and tp["predicted_B_ms"] == tp["estimated_B_ms"] > 0
    assert any(n.startswith("TP on stage 0: the estimator has none for the run") for n in out["notes"])


def test_bad_input_is_one_line_and_exit_2(db: Path, tmp_path: Path) -> None:
    before = db.read_bytes()
    wrong = run_cli("predict", "pp2_mb1", "--config", CONFIGS / "tp2dp2_mlp.yaml", "--to", CONFIGS / "pp2_mb8.yaml",
                    "--db", db, check=False)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
    assert wrong.stderr.startswith(f"error: {CONFIGS / 'tp2dp2_mlp.yaml'}: parallel.pp=1 but run 'pp2_mb1'")
    missing = tmp_path / "nope.yaml"
    gone = run_cli("predict", "pp2_mb1", "--config", CONFIGS / "pp2_mb1.yaml", "--to", missing, "--db", db,
                   check=False)
    assert gone.returncode == 2 and gone.stderr == f"error: {missing}: cannot read (No such file or directory)\n"
    assert db.read_bytes() == before


def test_the_api_returns_what_the_command_prints(db: Path) -> None:
    a, b = PAIRS[1]
    got = Traces(db, run=a).predict(CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml")
    out = predict_json(db, a, CONFIGS / f"{a}.yaml", CONFIGS / f"{b}.yaml")
    # two processes: DuckDB's parallel aggregates may differ in the last bits, and the notes print 3 decimals
    for mine, printed in zip(got.step.to_dicts(), out["step"], strict=True):
        assert (mine["dim"], mine["source"]) == (printed["dim"], printed["source"])
        numbers = [k for k, v in printed.items() if isinstance(v, float)]
        assert [mine[k] for k in numbers] == pytest.approx([printed[k] for k in numbers], rel=1e-9, abs=1e-12)
    assert len(got.notes) == len(out["notes"])


def test_a_layout_without_a_pipeline_keeps_no_pipeline_wait(tmp_path: Path) -> None:
    """Synthesized tp2 pp2 dp2 -> tp2 pp1 dp4 (8 GPU-format ranks, 8 -> 4 micro-batches): without stages there is no
    PP_WAIT, and the step lands within 8% of the one the synthesizer planned for the target (its truth.json; 6% over
    it here: the estimator's DP and the run's IDLE, kept, are what remain); the run's pipeline wait scaled by the
    schedule kept 2.1 of 4.8 ms and missed it by 16%."""
    base = Path(__file__).resolve().parents[2] / "examples" / "synth_gpt_tp2pp2.yaml"
    raw = yaml.safe_load(base.read_text())
    raw["parallel"] |= {"pp": 1, "dp": 4}
    target = tmp_path / "tp2_dp4.yaml"
    target.write_text(yaml.safe_dump(raw))
    db = tmp_path / "s.duckdb"
    for name, cfg, seed, layout in (("a", base, 0, "tp=2,pp=2,dp=2"), ("b", target, 10, "tp=2,pp=1,dp=4")):
        run_cli("synth", cfg, tmp_path / name, "--steps", "4", "--seed", str(seed))
        run_cli("ingest", tmp_path / name / "traces", "--db", db, "--run-id", name, "--layout", layout)
    planned_ms = json.loads((tmp_path / "b" / "truth.json").read_text())["step_ns"] / 1e6
    out = predict_json(db, "a", base, target)
    step = {r["dim"]: r for r in out["step"]}
    assert step["PP_WAIT"]["predicted_B_ms"] == 0 and step["TOTAL"]["source"] == "no pipeline"
    assert step["TOTAL"]["predicted_B_ms"] == pytest.approx(sum(step[d]["predicted_B_ms"] for d in step
                                                                if d not in ("TOTAL", "PP_WAIT")), rel=1e-9)
    assert step["TOTAL"]["predicted_B_ms"] == pytest.approx(planned_ms, rel=0.08)
