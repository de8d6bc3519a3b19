"""Predict another configuration of the same job from its measured run (DESIGN §8, `traceana predict`).

The measured run is the anchor; the estimator only says how each piece changes. Per pipeline stage, over the typical
step (the breakdown views' mean over steps after the first, over the stage's ranks):

- COMP, MP_WAIT, CP_WAIT, EP_WAIT, DP_WAIT: measured in the run, times the estimator's ratio target / source for that
  piece (compute from the shapes; a dim's exposed communication from its volumes and alpha-beta times). So the
  bandwidth each dim achieved, and the share of its communication left exposed, are the run's own: only the change
  in work comes from the estimator. Its communication times are the run's own network and library's
  (:func:`_run_hardware`: the backend the trace shows, the alpha-beta its collectives of several sizes fit), so a
  ratio of two volumes is latency-bound where the run was, and gloo's reduce-scatter is the all-reduce it runs.
- IDLE (time no device activity covers: host gaps, launch latency): measured, times the estimator's ratio of the
  device's wait for the host where it models host time (calibration.host_us_per_layer, a hardware profile), else
  times the ratio of layer passes the host issues (micro-batches x layers on the stage), its unit of host work.
- PP_WAIT and TOTAL: the pipeline is replayed by the estimator's schedule simulator (estimator/pipeline.py) for
  both configurations, fed with the measured per-micro-batch stage times (scaled for the target) and the run's
  measured point-to-point transfer time, each transfer a rendezvous where the run's backend is gloo (its send
  waits for the receiver; ``schedule.p2p``); the step then is the measured TOTAL times simulated target / simulated
  source, so what the schedule model misses on the measured run (a constant factor) carries over rather than being
  dropped. PP_WAIT is what the step leaves over the stage's other parts.
- Memory: the measured peak times the estimator's peak ratio, else the estimator's peak.

That is the path for a change that alters the run's graph. A change that only re-prices the run's own ops (the
routing: model.expert_load, model.capacity_factor; nothing else differs) replays the run's dependency graph
instead (:func:`_replayed`): each rank's compute scaled for its EP rank's load, the EP transfers for the all-to-all
the most loaded rank receives, so the waits come from the run's own synchronisation. The notes say which path.

The error bar of each number, in quadrature: the run's replay residual (RMS over rank-steps of `traceana replay`'s
error against the measured TOTAL: how well the trace explains its own timing) and the spread (standard deviation
over mean) of the measured piece over the stage's rank-steps, the first step too (how much one measurement of it
can be off). It is measured on the source run alone, never fitted on the pairs that score it
(benchmarks/bench_predict.py). A change the trace cannot inform (another model, hardware, precision or
calibration; a dim the run did not use) is named in the notes with what was assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl

from traceana.analyses import breakdown as bd
from traceana.analyses.roofline import GEMMS
from traceana.errors import TraceanaError
from traceana.estimator import comm, compute, memory, pipeline
from traceana.estimator.config import Config, Hardware, Links, at_load
from traceana.estimator.estimate import Estimate, estimate
from traceana.estimator.stages import device_of_chunk
from traceana.model import compare, intervals

if TYPE_CHECKING:
    from traceana.model.whatif import Baseline

SCALED = {"COMP": "comp", "MP_WAIT": "mp_wait", "CP_WAIT": "cp_wait", "EP_WAIT": "ep_wait", "DP_WAIT": "dp_wait",
          "IDLE": "idle"}
WORK = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "OTHER_WAIT", "IDLE")  # per micro-batch work, fed to the schedule
DIMS = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT", "IDLE", "TOTAL")
DIM_OF = {"MP_WAIT": "TP", "CP_WAIT": "CP", "EP_WAIT": "EP", "DP_WAIT": "DP"}
Row = tuple[int, dict[str, float], dict[str, float], dict[str, float | None], dict[str, str]]  # stage, A, B, ratio, how


@dataclass(frozen=True)
class Prediction:
    """``stages``: per target stage and dim, ms: measured_A (the run), ratio, predicted_B, error_bar, estimated_B
    (the estimator alone) and what the prediction rests on (``source``). ``step``: the same over stages (mean, as
    compare reports a run). ``memory``: peak MiB measured, predicted with its error bar, and estimated.
    ``interval``: the predicted TOTAL's, with the sources that set its width (the TOTAL row's low and high)."""

    run_id: str
    config: str
    target: str
    stages: pl.DataFrame
    step: pl.DataFrame
    memory: dict[str, float | str | None]
    schedule: dict[str, float]  # the simulated steps and the p2p transfer each was fed, ms; empty when replayed
    notes: list[str]
    interval: intervals.Interval


def predict(con: duckdb.DuckDBPyConnection, run_id: str, cfg: Config, target: Config) -> Prediction:
    """Predict ``target`` from run ``run_id``, which ``cfg`` must describe (compare.check_matches)."""
    compare.check_matches(con, run_id, cfg)
    measured = bd.by_stage(con, run_id).rename({"pp": "stage"})
    if measured.is_empty():
        raise TraceanaError(f"run {run_id!r} has no device events, so nothing measured to predict from")
    if measured["stage"].null_count():
        if cfg.parallel.pp > 1:
            raise TraceanaError(f"run {run_id!r} has no pipeline stages: ingest it with --layout "
                                f"{cfg.parallel.layout.spec} to predict from it")
        measured = measured.with_columns(stage=pl.lit(0, pl.Int32))
    replays = _replays(cfg, target)
    notes = _assumptions(cfg, target, replays)
    identity = replace(target, source=cfg.source) == cfg
    spread = _spread(con, run_id)
    base, replay_pct = _replay_residual(con, run_id, notes)
    a = {int(r["stage"]): {d: r[f"{d}_mean_ms"] for d in DIMS} for r in measured.iter_rows(named=True)}
    scratch_b = est_a = est_b = None
    try:
        scratch_b = estimate(target)
        if target.hardware == cfg.hardware:  # the run's own backend and alpha-beta price both configs' communication
            hardware = _run_hardware(con, run_id, cfg, notes)
            est_a, est_b = estimate(replace(cfg, hardware=hardware)), estimate(replace(target, hardware=hardware))
        else:
            est_a, est_b = estimate(cfg), scratch_b
        if replays:
            rows, schedule = _replayed(con, run_id, a, est_a, est_b, base, notes), {}
        else:
            rows, schedule = _scaled(con, run_id, a, est_a, est_b, notes)
    except TraceanaError as exc:
        if not identity:
            raise TraceanaError(f"{cfg.source} → {target.source}: the estimator cannot price it: {exc}") from None
        # the same configuration: the run's own measured step, inside its interval, whatever the estimator makes of it
        rows = [(s, src, dict(src), dict.fromkeys(DIMS, 1.0), dict.fromkeys(DIMS, "trace (the same configuration)"))
                for s, src in sorted(a.items())]
        schedule = {}
        notes.append(f"--to is the run's own configuration: the prediction is the measured step (the estimator "
                     f"cannot price {target.source}: {exc})")
    same_stages = cfg.parallel.pp == target.parallel.pp
    out = []
    for s, src, pred, ratio, how in rows:
        for d in DIMS:
            cv = spread.get((s if same_stages else None, d), 0.0)
            out.append({"stage": s, "dim": d, "measured_A_ms": src[d], "ratio": ratio[d], "predicted_B_ms": pred[d],
                        "error_bar_ms": abs(pred[d]) * math.hypot(replay_pct / 100, cv),
                        "estimated_B_ms": _estimated(scratch_b.stages[s], d) if scratch_b else None,
                        "source": how[d]})
    stages = pl.DataFrame(out, schema_overrides={"ratio": pl.Float64, "estimated_B_ms": pl.Float64})
    step = (stages.group_by("dim", maintain_order=True)
            .agg(pl.col("measured_A_ms", "ratio", "predicted_B_ms", "error_bar_ms", "estimated_B_ms").mean(),
                 pl.col("source").unique(maintain_order=True).str.join("; ")))
    total = step.filter(pl.col("dim") == "TOTAL").row(0, named=True)
    interval = intervals.around(total["predicted_B_ms"], {
        "replay_residual": replay_pct / 100, "step_and_rank_spread": spread.get((None, "TOTAL"), 0.0),
        "change": abs(math.log(total["predicted_B_ms"] / total["measured_A_ms"]))
        if total["predicted_B_ms"] > 0 and total["measured_A_ms"] > 0 else 0.0},
        intervals.platform_of(con, run_id), kind_of(cfg, target), "predict")
    is_total = pl.col("dim") == "TOTAL"
    step = step.with_columns(pl.when(is_total).then(interval.low).alias("low"),
                             pl.when(is_total).then(interval.high).alias("high"),
                             pl.when(is_total).then(interval.level).alias("level"))
    notes += intervals.notes(interval)
    if est_b is None:  # the identity the estimator could not price: the run's own peak
        peak = compare.measured_quantities(con, run_id).get(compare.PEAK)
        mem = {"measured_A_MiB": peak, "predicted_B_MiB": peak, "error_bar_MiB": None, "estimated_B_MiB": None,
               "source": "trace (the same configuration)"}
    else:
        mem = _memory(con, run_id, est_a, est_b, notes)
    return Prediction(run_id, cfg.source, target.source, stages, step, mem, schedule, notes, interval)


def kind_of(cfg: Config, target: Config) -> str:
    """The kind of change a predict makes, as intervals are calibrated per kind: ``null`` (the same
    configuration), ``routing``, ``micro_batches``, ``layout``, ``seq_len``, ``schedule``, else ``other``."""
    if replace(target, source=cfg.source) == cfg:
        return "null"
    if _replays(cfg, target):
        return "routing"
    p, q = cfg.parallel, target.parallel
    same = replace(target, source=cfg.source)
    if replace(same, parallel=p) == cfg:
        if (p.tp, p.cp, p.dp, p.pp, p.ep) == (q.tp, q.cp, q.dp, q.pp, q.ep):
            return "micro_batches"
        return "layout"
    if replace(same, model=replace(target.model, seq_len=cfg.model.seq_len)) == cfg:
        return "seq_len"
    if replace(same, schedule=cfg.schedule) == cfg:
        return "schedule"
    return "other"


def _scaled(con: duckdb.DuckDBPyConnection, run_id: str, a: dict[int, dict[str, float]], est_a: Estimate,
            est_b: Estimate, notes: list[str]) -> tuple[list[Row], dict[str, float]]:
    """A change that alters the run's graph (micro-batches, layout, schedule, the model): per target stage each
    measured part times the estimator's ratio, the step by the schedule simulator (the module doc); and the
    simulated steps with the point-to-point transfer each was fed, ms."""
    cfg, target = est_a.config, est_b.config
    same_stages = cfg.parallel.pp == target.parallel.pp
    if not same_stages:
        mean = {d: sum(s[d] for s in a.values()) / len(a) for d in DIMS}
        notes.append(f"parallel.pp {cfg.parallel.pp} → {target.parallel.pp}: each target stage starts from the "
                     "run's mean over its stages")

    def source_of(stage: int) -> dict[str, float]:
        return a[stage] if same_stages else mean

    def source_est(stage: int, attr: str) -> float:
        """The source estimate's value for a target stage (its mean over stages when pp changes)."""
        if same_stages:
            return getattr(est_a.stages[stage], attr)
        return sum(getattr(s, attr) for s in est_a.stages) / len(est_a.stages)

    rows, work_a, work_b, tails_a, tails_b = [], [], [], [], []
    for s in range(target.parallel.pp):
        src, pred, ratio, how = source_of(s), {}, {}, {}
        passes_a = cfg.micro_batches * source_est(s, "layers")
        passes = target.micro_batches * est_b.stages[s].layers / passes_a if passes_a else 1.0
        for part, attr in SCALED.items():
            before, after = source_est(s, attr) * 1e3, getattr(est_b.stages[s], attr) * 1e3
            if before > 0:
                ratio[part], how[part] = after / before, "trace × estimator"
            elif after > 0:
                ratio[part], how[part], pred[part] = None, "estimator (run has none)", after
                notes.append(f"{DIM_OF.get(part, part)} on stage {s}: the estimator has none for the run, so its "
                             f"{after:.3f} ms is the estimator's alone, no trace evidence")
                continue
            elif part == "IDLE":  # the estimator models no host time here: host work is per layer pass
                ratio[part], how[part] = passes, "trace × layer passes"
            else:
                ratio[part], how[part] = 1.0, "trace"
            pred[part] = src[part] * ratio[part]
        ratio["OTHER_WAIT"], pred["OTHER_WAIT"], how["OTHER_WAIT"] = 1.0, src["OTHER_WAIT"], "trace"
        if src["OTHER_WAIT"] > 0:
            notes.append(f"stage {s}: {src['OTHER_WAIT']:.3f} ms of communication of unknown dim (OTHER_WAIT) kept "
                         "as measured: no estimator ratio names it")
        work_a.append(sum(src[d] for d in WORK) / cfg.micro_batches)
        work_b.append(sum(pred[d] for d in WORK) / target.micro_batches)
        tails_a.append(src["DP_WAIT"])
        tails_b.append(pred["DP_WAIT"])
        rows.append((s, src, pred, ratio, how))

    p2p_a = _p2p_ms(con, run_id, est_a)
    p2p_b = p2p_a * est_b.p2p_s / est_a.p2p_s if est_a.p2p_s else est_b.p2p_s * 1e3
    sim_a = _schedule(cfg, est_a, work_a if same_stages else [sum(work_a) / len(work_a)] * cfg.parallel.pp, p2p_a,
                      tails_a)
    sim_b = _schedule(target, est_b, work_b, p2p_b, tails_b)
    done = []
    unpipelined = target.parallel.pp == 1 < cfg.parallel.pp
    if unpipelined:
        notes.append(f"parallel.pp {cfg.parallel.pp} → 1: no pipeline, so no PP_WAIT; the step is its other parts")
    for s, src, pred, ratio, how in rows:
        rest = sum(pred[d] for d in DIMS if d not in ("PP_WAIT", "TOTAL"))
        # no pipeline: nothing of the run's pipeline wait remains (scaled by the schedule, it stayed: synthesized
        # tp2 pp2 dp2 -> tp2 dp4 kept 2.1 of its 4.8 ms PP_WAIT and missed the step by 14%)
        total = rest if unpipelined else src["TOTAL"] * sim_b / sim_a
        if rest > total:
            notes.append(f"stage {s}: its predicted parts ({rest:.3f} ms) exceed the step the schedule scales to "
                         f"({total:.3f} ms), so its step is the parts and its PP_WAIT 0")
        pred["PP_WAIT"], pred["TOTAL"] = max(0.0, total - rest), max(total, rest)
        ratio["PP_WAIT"] = ratio["TOTAL"] = pred["TOTAL"] / src["TOTAL"] if unpipelined else sim_b / sim_a
        how["PP_WAIT"] = how["TOTAL"] = "no pipeline" if unpipelined else "trace × schedule"
        done.append((s, src, pred, ratio, how))
    notes.append(f"pipeline: {cfg.schedule.kind} with {cfg.micro_batches} micro-batches simulated at {sim_a:.3f} ms "
                 f"from the run's stage times, {target.schedule.kind} with {target.micro_batches} at {sim_b:.3f} "
                 f"ms; point-to-point {p2p_a:.3f} → {p2p_b:.3f} ms per transfer")
    return done, {"source_ms": sim_a, "target_ms": sim_b, "p2p_source_ms": p2p_a, "p2p_target_ms": p2p_b}


REPLAYED = ("capacity_factor", "expert_load")  # model fields that re-price the run's own ops, not add or move any


def _replays(cfg: Config, target: Config) -> bool:
    """Whether ``target`` is the run's graph with other per-op costs only: the configs differ in the routing
    (model.expert_load, model.capacity_factor) and nothing else, so the same ops run in the same order."""
    routed = {name: getattr(cfg.model, name) for name in REPLAYED}
    return target.model != cfg.model and replace(target, model=replace(target.model, **routed),
                                                  source=cfg.source) == cfg


def _loads(cfg: Config) -> tuple[float, ...]:
    """Per EP rank, the tokens its experts compute relative to a balanced share."""
    return cfg.model.expert_load or (cfg.model.capacity_factor,) * cfg.parallel.ep


def _replayed(con: duckdb.DuckDBPyConnection, run_id: str, a: dict[int, dict[str, float]], est_a: Estimate,
              est_b: Estimate, base: Baseline | None, notes: list[str]) -> list[Row]:
    """A routing change: the run's dependency graph replayed with each rank's compute times the ratio for its EP
    rank's load (the run's own load curve where its ranks ran at several loads, :func:`_load_curves`; else the
    estimator's ratio of the stage's matrix products at the target's load over the run's, for the share of the
    rank's compute its products took, :func:`_gemm_shares`: the optimizer step, gradient-bucket copies and the like
    do not follow the routing, and moe_balanced's ranks spend a third of their compute there; else, when the trace
    tells no products apart, the estimator's stage COMP ratio) and the EP transfers times the ratio of the
    all-to-all the most loaded rank receives, so who waits for whom is the run's own synchronisation, not a stage
    mean. Each part: measured plus what the change moves it in the replay (whatif.predicted), over the typical step
    (the steps after the first, as the breakdown's); ``base``: the run's plain replay, when already built."""
    from traceana.model import whatif

    at: dict[tuple[int, float], Estimate] = {}  # (0 the run's config, 1 the target's; a load) -> its estimate

    def stage_comp(which: int, load: float, stage: int) -> float:
        if (which, load) not in at:
            at[which, load] = estimate(at_load((est_a, est_b)[which].config, load))
        return at[which, load].stages[stage].comp

    loads_a, loads_b = _loads(est_a.config), _loads(est_b.config)
    ranks = con.execute("SELECT rank, coalesce(ep, 0), coalesce(pp, 0) FROM ranks WHERE run_id = ? ORDER BY rank",
                        [run_id]).fetchall()
    curves = _load_curves(con, run_id, loads_a, notes)
    gemm_share = _gemm_shares(con, run_id)
    if not curves and not any(gemm_share.values()):
        notes.append("compute: the run's compute names no matrix product (aten::mm, a *gemm* kernel ...), so each "
                     "rank's whole compute is priced at the estimator's COMP ratio")

    def product_ratio(e: int, s: int) -> float | None:  # None: the stage has no products to re-price
        source = _stage_gemm_s(est_a.config, loads_a[e], est_a, s)
        return _stage_gemm_s(est_b.config, loads_b[e], est_b, s) / source if source else None

    ratios = {(e, s): product_ratio(e, s) for e, s in {(e, s) for _, e, s in ranks}} if gemm_share else {}

    def factor(r: int, e: int, s: int) -> float:
        if s in curves:
            fixed, per_load = curves[s]
            return (fixed + per_load * loads_b[e]) / (fixed + per_load * loads_a[e])
        ratio = ratios.get((e, s))
        if ratio is not None:
            return 1 + gemm_share.get(r, 0.0) * (ratio - 1)
        return stage_comp(1, loads_b[e], s) / stage_comp(0, loads_a[e], s)

    factors = {r: factor(r, e, s) for r, e, s in ranks}
    how = ("the ratio for its EP rank's load" if curves or not gemm_share else
           "1 + its matrix products' share of it x (the estimator's product ratio for its EP rank's load - 1): "
           "the rest, the optimizer and copies, does not follow the routing")
    ep_a, ep_b = (comm.ep_layer(e.config) for e in (est_a, est_b))
    ep = (ep_b.forward + ep_b.backward) / (ep_a.forward + ep_a.backward) if ep_a.forward + ep_a.backward else 1.0
    changes = [whatif.Change("rank", str(r), f) for r, f in factors.items()] + [whatif.Change("dim", "EP", ep)]
    _, frame, _ = whatif.whatif_run(con, run_id, changes, base=base)
    steady = (pl.len().over("rank") == 1) | (pl.col("step") > pl.col("step").min().over("rank"))
    typical = (frame.filter(steady).with_columns(pl.col("stage").fill_null(0))
               .group_by("stage").agg(pl.col(f"predicted_{d}_ms").mean().alias(d) for d in DIMS))
    by_factor: dict[float, list[int]] = {}
    for r, f in factors.items():
        by_factor.setdefault(round(f, 3), []).append(r)
    notes.append("path: the run's dependency graph replayed (the change re-prices its ops, it adds or moves none): "
                 f"each rank's compute times {how} ("
                 + "; ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {f:.3f}"
                             for f, rs in by_factor.items())
                 + f") and the EP transfers times {ep:.3f}, so who waits for whom is the run's own synchronisation")
    rows = []
    for row in typical.sort("stage").iter_rows(named=True):
        s, src = int(row["stage"]), a[int(row["stage"])]
        pred = {d: row[d] for d in DIMS}
        ratio = {d: pred[d] / src[d] if src[d] else None for d in DIMS}
        how = {d: "trace replayed" for d in DIMS}
        how["COMP"] = f"trace replayed × {'run load curve' if s in curves else 'estimator'} per rank"
        rows.append((s, src, pred, ratio, how))
    return rows


GEMM_OPS = (*GEMMS, "aten::linear", "aten::matmul")  # the products, and a CPU-only run's outermost ops over them
GEMM_KERNELS = "gemm|nvjet|matmul"  # cuBLAS (sm90_xmma_gemm_*, ampere_*gemm*), cuBLASLt's nvjet_*, Ascend MatMulV2


def _gemm_shares(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, float]:
    """Per rank, the share of its compute (typical step) spent in matrix products: compute events an ``aten::mm``
    family op launched (event_ops), or named so themselves (a CPU run's ops, a kernel matching GEMM_KERNELS).
    Empty when no rank has any: the trace cannot tell its products apart."""
    rows = con.execute(f"""
        WITH w AS (SELECT rank, step, start_ns, end_ns,
                          count(*) OVER r = 1 OR step > min(step) OVER r AS steady
                   FROM step_windows WHERE run_id = $run WINDOW r AS (PARTITION BY rank)),
        gemm AS (SELECT e.rank, sum(e.end_ns - e.start_ns) AS ns
                 FROM device_events e
                 JOIN w ON w.rank = e.rank AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns AND w.steady
                 LEFT JOIN event_ops o ON o.run_id = e.run_id AND o.rank = e.rank AND o.event_id = e.event_id
                 WHERE e.run_id = $run AND e.category = 'compute'
                   AND (coalesce(o.op, e.name) IN {GEMM_OPS} OR regexp_matches(e.name, '{GEMM_KERNELS}', 'i'))
                 GROUP BY e.rank),
        steps AS (SELECT rank, count(*) AS n FROM w WHERE steady GROUP BY rank)
        SELECT b.rank, least(1.0, gemm.ns / steps.n / nullif(b.COMP_ns, 0))
        FROM rank_breakdown b JOIN gemm ON gemm.rank = b.rank JOIN steps ON steps.rank = b.rank
        WHERE b.run_id = $run AND b.step IS NULL""", {"run": run_id}).fetchall()
    return {int(r): float(share) for r, share in rows if share is not None}


def _stage_gemm_s(cfg: Config, load: float, est: Estimate, stage: int) -> float:
    """The estimator's matrix-product seconds for one micro-batch through ``stage``'s layers (and the output layer
    on the last), its EP rank at ``load``: what a routing change re-prices."""
    at = at_load(cfg, load)
    chunks = [layers for k, layers in enumerate(est.chunks) if device_of_chunk(at, k) == stage]
    seconds = sum(compute.gemm_seconds(compute.layer_gemms(at, i), at).total * n
                  for layers in chunks for i, n in memory.layer_kinds(at, layers).items())
    if est.chunks[-1] in chunks and at.model.vocab:
        seconds += compute.gemm_seconds(compute.head_gemms(at), at).total
    return seconds


def _load_curves(con: duckdb.DuckDBPyConnection, run_id: str, loads: tuple[float, ...],
                 notes: list[str]) -> dict[int, tuple[float, float]]:
    """Per stage whose ranks ran at two loads or more: (fixed, per load) ms, the least squares of each rank's
    measured COMP (typical step) on its EP rank's load. A small GEMM costs more than its FLOPs (moe_skewed's cold
    ranks compute 16 tokens in 0.6x a balanced rank's time, not 0.25x), which a run shows where its ranks computed
    different loads; a stage with one load, or a fit not positive at every load, keeps the estimator's ratio."""
    rows = con.execute("SELECT coalesce(pp, 0), coalesce(ep, 0), COMP_ns / 1e6 FROM rank_breakdown "
                       "WHERE run_id = ? AND step IS NULL", [run_id]).fetchall()
    curves = {}
    for stage in sorted({r[0] for r in rows}):
        x = np.array([loads[e] for s, e, _ in rows if s == stage])
        y = np.array([comp for s, _, comp in rows if s == stage])
        if len(set(x.tolist())) < 2:
            continue
        per_load, fixed = np.polyfit(x, y, 1)
        if fixed < 0 or per_load <= 0:
            notes.append(f"compute on stage {stage}: the run's COMP per rank fits no positive curve on its load "
                         f"({fixed:.3f} ms + {per_load:.3f} ms x load), so the estimator's ratio prices each rank")
            continue
        curves[stage] = (float(fixed), float(per_load))
        notes.append(f"compute on stage {stage}: the run's own COMP per rank on its EP rank's load, {fixed:.3f} ms + "
                     f"{per_load:.3f} ms x load (least squares over {len(x)} ranks), prices each rank's ratio")
    return curves


def _estimated(stage: object, dim: str) -> float | None:
    attr = compare.ESTIMATED.get(dim)
    return getattr(stage, attr) * 1e3 if attr else None


def _schedule(cfg: Config, est: Estimate, work_ms: list[float], p2p_ms: float, tails_ms: list[float]) -> float:
    """The step by the estimator's schedule: each stage's per-micro-batch work (ms) split into forward, backward and
    weight gradient as the estimator splits that stage's, simulated, plus the longest data-parallel tail."""
    p = cfg.parallel
    vpp = 2 if cfg.schedule.kind == "zb-v" else p.vpp
    order = pipeline.segment_cost_index(cfg.schedule.kind, p.pp, vpp)
    costs = [c.stage_cost() for c in est.costs]
    shares = [0.0] * p.pp
    for k, c in enumerate(costs):
        shares[device_of_chunk(cfg, k)] += c.forward_s + c.backward_s + c.wgrad_s
    segments: list[pipeline.StageCost] = [pipeline.StageCost(0, 0, 0)] * len(order)
    for k, i in enumerate(order):
        device = device_of_chunk(cfg, k)
        scale = work_ms[device] / 1e3 / shares[device] if shares[device] else 0.0
        segments[i] = replace(costs[k], forward_s=costs[k].forward_s * scale, backward_s=costs[k].backward_s * scale,
                              wgrad_s=costs[k].wgrad_s * scale)
    result = pipeline.simulate(cfg.schedule.kind, segments, cfg.micro_batches, p2p_ms / 1e3, vpp,
                               cfg.calibration.ep_bubble_overlap_ratio,
                               cfg.schedule.blocking_p2p(est.config.hardware.collectives))
    return result.makespan_s * 1e3 + max(tails_ms)


def _p2p_ms(con: duckdb.DuckDBPyConnection, run_id: str, est: Estimate) -> float:
    """The run's pipeline transfer time: mean over its PP instances of the time from the last arrival to the end
    (the transfer, without the wait); the estimator's when the run has none."""
    got = con.execute("SELECT avg(last_end_ns - last_start_ns) / 1e6 FROM collective_instances "
                      "WHERE run_id = ? AND dim = 'PP' AND ranks_seen > 1", [run_id]).fetchall()[0][0]
    return float(got) if got is not None else est.p2p_s * 1e3


BUS = {  # the collective the backend ran -> (latency steps, bus bytes per byte of a rank's buffer) of a ring, n ranks
    "AllReduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n),
    "ReduceScatter": lambda n: (n - 1, (n - 1) / n),
    "AllGather": lambda n: (n - 1, n - 1),  # a rank's buffer is its input, the gathered output n times it
}


def _run_hardware(con: duckdb.DuckDBPyConnection, run_id: str, cfg: Config, notes: list[str]) -> Hardware:
    """cfg's hardware with its communication as the run's own network and library have it: the collectives' backend
    from the trace (gloo's ranges are named ``gloo:*``; it runs a reduce-scatter as a whole all-reduce), and per
    network level (a group inside one node of cfg's devices_per_node, or across) the alpha-beta of the run's own
    all-reduces, reduce-scatters and all-gathers (not all-to-alls, which keep calibration.a2a_efficiency; not PP,
    whose transfer is measured directly): least squares of each (op as run, group size, bytes)'s mean transfer
    time (last arrival to end) on ring steps x latency + bus bytes / bandwidth. A level whose collectives have one
    size, or whose fit is not positive, keeps the config's values, said in a note."""
    per_node = cfg.hardware.devices_per_node
    rows = con.execute(
        "WITH one AS (SELECT i.instance, any_value(coalesce(c.kernel_op, c.op)) AS op, len(any_value(i.ranks)) AS n, "
        "max(c.bytes) AS bytes, any_value(i.last_end_ns - i.last_start_ns) AS ns, "
        "len(list_distinct(list_transform(any_value(i.ranks), lambda r: r // $node))) > 1 AS inter "
        "FROM collective_instances i JOIN collectives c USING (run_id, instance) "
        "WHERE i.run_id = $run AND i.ranks_seen > 1 AND c.dim <> 'PP' GROUP BY i.instance) "
        "SELECT inter, op, n, bytes, avg(ns) / 1e3, count(*) FROM one "
        "WHERE bytes > 0 GROUP BY ALL ORDER BY ALL", {"run": run_id, "node": per_node}).fetchall()
    gloo = con.execute("SELECT count(*) FROM device_events WHERE run_id = ? AND category = 'comm' "
                       "AND starts_with(name, 'gloo:')", [run_id]).fetchall()[0][0]
    backend = "gloo" if gloo else cfg.hardware.collectives
    if backend != cfg.hardware.collectives:
        notes.append(f"collectives: the run ran them on {backend} (its ranges are named gloo:*), so both configs' "
                     "communication is priced as gloo runs it (a reduce-scatter as a whole all-reduce)")
    hw = cfg.hardware
    links = {"intra": (hw.latency_us.intra, hw.bandwidth_gb_per_s.intra),
             "inter": (hw.latency_us.inter, hw.bandwidth_gb_per_s.inter)}
    for level, inter in (("intra", False), ("inter", True)):
        points = [(*BUS[op](n), b, us, k) for i, op, n, b, us, k in rows if i == inter and op in BUS]
        if not points:
            continue
        steps, bus = np.array([p[0] for p in points], float), np.array([p[1] * p[2] for p in points], float)
        (alpha, per_byte), _, rank, _ = np.linalg.lstsq(np.column_stack([steps, bus]), [p[3] for p in points],
                                                        rcond=None)
        count = sum(p[4] for p in points)
        if rank < 2 or alpha <= 0 or per_byte <= 0:
            notes.append(f"links {level}: the run's {count} collectives of {len(points)} size(s) fit no positive "
                         f"alpha-beta, so the config's {links[level][0]:g} µs and {links[level][1]:g} GB/s price them")
            continue
        links[level] = (float(alpha), float(1e-3 / per_byte))
        notes.append(f"links {level}: the run's own alpha-beta over its {count} collectives of {len(points)} sizes, "
                     f"{alpha:.1f} µs a ring step and {1e-3 / per_byte:.3f} GB/s of bus bandwidth (the config says "
                     f"{getattr(hw.latency_us, level):g} µs, {getattr(hw.bandwidth_gb_per_s, level):g} GB/s)")
    return replace(hw, collectives=backend, latency_us=Links(links["intra"][0], links["inter"][0]),
                   bandwidth_gb_per_s=Links(links["intra"][1], links["inter"][1]))


def _spread(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[tuple[int | None, str], float]:
    """Per (stage, part), and (None, part) over the whole run: stddev / mean of the part over every rank-step
    (the first step too: it is the run's own evidence of how much one step varies from the next). Each aggregate
    reads its rows in one order: summed in the order threads finish, the last digit changed from process to
    process."""
    parts = ", ".join(f"coalesce(stddev_samp({d}_ns ORDER BY rank, step) / nullif(avg({d}_ns ORDER BY rank, step), "
                      f"0), 0) AS {d}" for d in DIMS)
    frame = con.sql(f"SELECT coalesce(pp, 0) AS stage, {parts} FROM rank_step_breakdown WHERE run_id = $run "
                    "GROUP BY GROUPING SETS ((coalesce(pp, 0)), ())", params={"run": run_id}).pl()
    return {(None if r["stage"] is None else int(r["stage"]), d): float(r[d])
            for r in frame.iter_rows(named=True) for d in DIMS}


def _replay_residual(con: duckdb.DuckDBPyConnection, run_id: str, notes: list[str]) -> tuple[Baseline | None, float]:
    """(the run's replay, for a what-if from it; RMS over the run's rank-steps of the replay's TOTAL error, %); (None,
    0) with a note when the run cannot be replayed (the error bar is then the spread alone)."""
    from traceana.model.replay import side_by_side
    from traceana.model.whatif import baseline

    try:
        base = baseline(con, run_id)
    except TraceanaError as exc:
        notes.append(f"error bar: the spread of each measured part alone; no replay residual ({exc})")
        return None, 0.0
    errors = side_by_side(base.measured, base.replayed)["error_pct"].drop_nulls()
    rms = float((errors ** 2).mean() ** 0.5) if len(errors) else 0.0
    notes.append(f"error bar: replay residual {rms:.1f}% (RMS over rank-steps) with the spread of each measured part "
                 "over the stage's ranks and steps")
    return base, rms


def _memory(con: duckdb.DuckDBPyConnection, run_id: str, est_a: Estimate, est_b: Estimate,
            notes: list[str]) -> dict[str, float | str | None]:
    """Peak MiB: the run's largest rank peak times the estimator's ratio, else the estimator's; the error bar is
    the estimator's own miss on the run's peak, scaled to the prediction."""
    peak_b = est_b.peak_memory / memory.MIB
    measured = compare.measured_quantities(con, run_id).get(compare.PEAK)
    if measured is None:
        notes.append("memory: the run sampled no memory, so the peak is the estimator's alone")
        return {"measured_A_MiB": None, "predicted_B_MiB": peak_b, "error_bar_MiB": None,
                "estimated_B_MiB": peak_b, "source": "estimator"}
    miss = abs(est_a.peak_memory / memory.MIB / measured - 1)
    predicted = measured * est_b.peak_memory / est_a.peak_memory
    return {"measured_A_MiB": measured, "predicted_B_MiB": predicted, "error_bar_MiB": miss * predicted,
            "estimated_B_MiB": peak_b, "source": "trace × estimator"}


INFORMED = {"model": ("seq_len",), "parallel": None, "schedule": None}  # None: every field is what predict is for


def _assumptions(cfg: Config, target: Config, replays: bool) -> list[str]:
    """A note per changed setting the trace cannot inform: the model's shapes (but the sequence length, and the
    routing where the run's graph is replayed), the hardware, precision and calibration; the ratio then is the
    estimator's alone."""
    notes = []
    for section in ("model", "hardware", "precision", "calibration", "parallel", "schedule"):
        before, after = getattr(cfg, section), getattr(target, section)
        informed = INFORMED.get(section, ())
        if section == "model" and replays:
            informed = (*informed, *REPLAYED)
        for f in fields(before):
            x, y = getattr(before, f.name), getattr(after, f.name)
            if x == y or informed is None or f.name in informed:
                continue
            what = ("per-layer times scaled by the estimator's FLOP ratio" if section == "model"
                    else "times scaled by the estimator's ratio")
            notes.append(f"{section}.{f.name} {x} → {y}: {what}, no trace evidence")
    return notes
