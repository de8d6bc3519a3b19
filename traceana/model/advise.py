"""Advise: ranked findings, each with its measured evidence, a concrete change and the gain what-if predicts for it
(DESIGN §8). No finding without evidence from a view, no gain without a replayed prediction and its error bar.

Findings looked for, on one step (the second, or the only one):
- host-bound idle: IDLE is a large share of the step and the device waited on launches -> ``host=0`` (CUDA graphs);
- exposed communication per dim: a dim's WAIT share -> that dim's transfers 2x faster; for DP (gradients, which
  nothing in the step consumes at once), where some of it already runs beside compute, also fully overlapped;
- straggler ranks: stragglers view, COMP above the group's median -> each such rank (and all of them) to the median;
- straggler stage: the stage with the largest mean COMP -> ``stage=P:median`` (what rebalancing its layers buys).
With the job's estimator config, also what only the estimator can predict (:func:`estimator_findings`). The step's
length is the median rank's TOTAL (the ranks of one job start their steps together, so their TOTALs agree up to
where each rank's window is cut); a gain is measured minus predicted step, in ms.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import polars as pl

from traceana.analyses import critical_path
from traceana.analyses.breakdown import check_step
from traceana.model import whatif
from traceana.model.graph import Graph
from traceana.model.intervals import Interval

IDLE_SHARE = 0.2      # IDLE above this share of the step is worth a finding
WAIT_SHARE = 0.05     # a dim's exposed wait above this share
STRAGGLER_PCT = 5.0   # COMP this far above the group's median
OVERLAPPABLE = 0.05   # the share of DP communication that already runs beside compute, for an overlap what-if
SLOW_LINK_PCT = 20.0  # a process group this far below its peers' median bandwidth
HEADROOM = 0.7        # a measured peak below this share of the device's memory leaves room


def findings(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None,
             config_path: str | None = None) -> tuple[int, pl.DataFrame]:
    """(step, findings by predicted gain less its error bar): finding, evidence, change, predicted step and gain in
    ms, the error bar in ms; with ``config_path`` (the job's estimator YAML) also :func:`estimator_findings`."""
    from traceana.model.intervals import platform_of

    step = critical_path.default_step(con, run_id) if step is None else step
    check_step(con, run_id, step)
    cfg = None
    if config_path is not None:  # refuse a config that does not describe the run before any search
        from traceana.estimator import config
        from traceana.model.compare import check_matches

        cfg = config.load(config_path)
        check_matches(con, run_id, cfg)
    platform = platform_of(con, run_id)
    measured = con.sql("SELECT * FROM rank_step_breakdown WHERE run_id = $run AND step = $step",
                       params={"run": run_id, "step": step}).pl()
    total = float(measured["TOTAL_ns"].median())
    proposed: list[tuple[str, str, list[str]]] = []  # (finding, evidence, changes), replayed together below

    def propose(finding: str, evidence: str, changes: list[str]) -> None:
        proposed.append((finding, evidence, changes))

    mean = measured.select(pl.exclude("run_id", "rank", "tp", "cp", "ep", "dp", "pp", "step").mean()).row(0, named=True)
    idle = mean["IDLE_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0
    launched = con.execute("SELECT count(launch_ns) FROM device_events WHERE run_id = ?", [run_id]).fetchall()[0][0]
    if idle > IDLE_SHARE and launched:
        propose("host-bound idle", f"rank_step_breakdown: IDLE {mean['IDLE_ns'] / 1e6:.2f} of "
                f"{mean['TOTAL_ns'] / 1e6:.2f} ms ({100 * idle:.0f}%) per rank; kernels launched as the device ran "
                "dry", ["host=0"])
    for part, dim in (("MP_WAIT", "TP"), ("CP_WAIT", "CP"), ("EP_WAIT", "EP"), ("DP_WAIT", "DP"), ("PP_WAIT", "PP")):
        share = mean[f"{part}_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0
        if share > WAIT_SHARE:
            evidence = (f"rank_step_breakdown: {part} {mean[f'{part}_ns'] / 1e6:.2f} ms ({100 * share:.0f}% of the "
                        "step) exposed per rank")
            propose(f"exposed {dim} communication", evidence, [f"dim={dim}:0.5"])
            overlapped = _dp_overlapped(con, run_id, step) if dim == "DP" else 0.0
            if overlapped > OVERLAPPABLE:
                # only gradient sync can run beside other work (TP, CP, EP, PP outputs are consumed next), and only
                # where the job already runs it beside compute (buckets on their own stream); a job that syncs
                # gradients in one blocking call needs a code change the graph cannot predict
                propose("exposed DP communication, overlapped with compute", f"{evidence}; "
                        f"{100 * overlapped:.0f}% of it already runs beside compute (step_segments)", ["overlap=DP"])
    stragglers = con.sql("SELECT rank, pp, COMP_excess_pct FROM stragglers WHERE run_id = ? AND COMP_excess_pct > ? "
                         "ORDER BY COMP_excess_pct DESC", params=[run_id, STRAGGLER_PCT]).pl()
    for rank, excess in zip(stragglers["rank"], stragglers["COMP_excess_pct"], strict=True):
        propose(f"straggler rank {rank}", f"stragglers: COMP {excess:.1f}% above its group's median",
                [f"rank={rank}:median"])
    if stragglers.height > 1:
        ranks = stragglers["rank"].to_list()
        propose(f"straggler ranks {', '.join(map(str, ranks))}", "stragglers: "
                + ", ".join(f"rank {r} +{e:.1f}%" for r, e in zip(ranks, stragglers["COMP_excess_pct"], strict=True)),
                [f"rank={r}:median" for r in ranks])
    from traceana.analyses.comm import by_group, matrix, slow_links

    slow = slow_links(matrix(con, run_id), by_group(con, run_id), SLOW_LINK_PCT).filter(pl.col("what") == "group")
    for row in slow.filter(pl.col("who").is_not_null()).iter_rows(named=True):  # a group the store names
        pg = row["who"].split()[1]
        propose(f"slow {row['dim']} group {pg}", f"comm slow links: {row['op']} on pg {pg} at "
                f"{row['bandwidth_GBps']:.1f} GB/s busbw, {-row['vs_median_pct']:.0f}% below the median of its "
                f"{row['dim']} peers ({row['median_GBps']:.1f} GB/s): check its links",
                [f"pg={pg}:{row['bandwidth_GBps'] / row['median_GBps']:.3f}"])
    stages = measured.group_by("pp").agg(pl.col("COMP_ns").mean()).drop_nulls("pp").sort("COMP_ns", descending=True)
    if stages.height > 1:
        slow, comp = stages.row(0)
        others = float(stages["COMP_ns"][1:].median())
        if comp > others * (1 + STRAGGLER_PCT / 100):
            propose(f"straggler stage {slow}", f"stage_breakdown: stage {slow} mean COMP {comp / 1e6:.2f} ms, "
                    f"{100 * (comp / others - 1):.0f}% above the other stages' median {others / 1e6:.2f} ms: "
                    "rebalance its layers", [f"stage={slow}:median"])
    rows: list[dict] = []
    if proposed:
        base = whatif.baseline(con, run_id)
        parsed = [[whatif.parse(c) for c in changes] for _, _, changes in proposed]
        g, frames, _ = whatif.whatif_runs(con, run_id, parsed, base)
        for (finding, evidence, changes), frame, changed in zip(proposed, frames, parsed, strict=True):
            frame = frame.filter(pl.col("step") == step)
            interval = whatif.step_interval(base, frame, changed, platform)
            rows.append({"finding": finding, "evidence": evidence, "change": " ".join(changes),
                         "measured_step_ms": total / 1e6, **_row(total / 1e6, interval),
                         "error_bar_ms": float(frame["error_bar_ms"].max()), "graph": _graph_note(g)})
    if config_path is not None:
        stage_comp = {int(k): v / 1e6 for k, v in zip(stages["pp"], stages["COMP_ns"], strict=True)}
        peak = con.execute("SELECT max(greatest(allocated_bytes, coalesce(reserved_bytes, 0))) FROM memory "
                           "WHERE run_id = ?", [run_id]).fetchall()[0][0]
        rows += estimator_findings(config_path, total / 1e6, stage_comp,
                                   mean["PP_WAIT_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0, peak, platform)
    frame = pl.DataFrame(rows, schema={"finding": pl.String, "evidence": pl.String, "change": pl.String,
                                       "measured_step_ms": pl.Float64, "predicted_step_ms": pl.Float64,
                                       "low": pl.Float64, "high": pl.Float64, "level": pl.Float64,
                                       "gain_ms": pl.Float64, "gain_low_ms": pl.Float64, "gain_high_ms": pl.Float64,
                                       "sources": pl.Object, "error_bar_ms": pl.Float64, "graph": pl.String})
    # ranked by what is surely gained: the lower end of the gain's interval
    return step, frame.sort("gain_low_ms", descending=True)


def _row(measured_ms: float, interval: Interval) -> dict:
    """A finding's predicted step and gain with their interval (the gain's ends are the step's, mirrored)."""
    return {"predicted_step_ms": interval.value, "low": interval.low, "high": interval.high, "level": interval.level,
            "gain_ms": measured_ms - interval.value, "gain_low_ms": measured_ms - interval.high,
            "gain_high_ms": measured_ms - interval.low, "sources": interval.sources}


def split(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(findings whose gain's interval reaches above zero, those checked with no gain possible at its level)."""
    return frame.filter(pl.col("gain_high_ms") > 0), frame.filter(pl.col("gain_high_ms") <= 0)


def _dp_overlapped(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> float:
    """The share of the step's DP communication time that already ran beside compute (step_segments)."""
    share = con.execute("SELECT sum(end_ns - start_ns) FILTER (WHERE busy) / nullif(sum(end_ns - start_ns), 0) "
                        "FROM step_segments WHERE run_id = $run AND step = $step AND dp",
                        {"run": run_id, "step": step}).fetchall()[0][0]
    return float(share or 0.0)


def _graph_note(g: Graph) -> str:
    """What the prediction rests on: the graph's edges that are fixed or inferred."""
    return (f"{g.counts.get('gap', 0)} fixed gaps, {g.counts.get('inferred', 0)} inferred waits, "
            f"{g.counts.get('unexplained', 0)} unexplained holds")


def estimator_findings(config_path: str, measured_step_ms: float, stage_comp_ms: dict[int, float],
                       pp_wait_share: float, peak_bytes: int | None = None, platform: str = "other") -> list[dict]:
    """What the graph cannot predict, from the estimator: each candidate that changes the graph itself (layers
    rebalanced between stages with seed 003's PPB, more and smaller micro-batches, another schedule, with memory to
    spare less recompute or larger micro-batches, the fastest layout `search` finds that fits), predicted as the
    measured step times the estimator's ratio new / now. The error bar is the estimator's own miss on this run
    (|estimate - measured| / measured), scaled to the prediction."""
    from dataclasses import replace

    from traceana.errors import TraceanaError
    from traceana.estimator import config, estimate, search
    from traceana.model import intervals

    cfg = config.load(config_path)
    now = estimate.estimate(cfg)
    miss = abs(now.step_s * 1e3 - measured_step_ms) / measured_step_ms
    rows: list[dict] = []

    def consider(finding: str, evidence: str, change: str, candidate: config.Config) -> None:
        try:
            config.validate(candidate)
            new = estimate.estimate(candidate)
        except TraceanaError:
            return
        if not new.fits or new.step_s >= now.step_s:
            return
        step_ms = measured_step_ms * new.step_s / now.step_s
        interval = intervals.around(step_ms, {"estimator_miss_on_run": abs(math.log1p(miss)) if miss < 1 else miss,
                                              "change": abs(math.log(new.step_s / now.step_s))},
                                    platform, f"advise:{finding}", "predict")
        rows.append({"finding": finding, "evidence": f"{evidence}; estimator {now.step_s * 1e3:.2f} -> "
                     f"{new.step_s * 1e3:.2f} ms", "change": change, "measured_step_ms": measured_step_ms,
                     **_row(measured_step_ms, interval), "error_bar_ms": miss * step_ms,
                     "graph": f"estimator ratio (its miss on this run: {100 * miss:.0f}%)"})

    p, s = cfg.parallel, cfg.schedule
    if p.pp > 1 and len(stage_comp_ms) > 1 and s.stage_layers != "ppb":
        slow = max(stage_comp_ms, key=stage_comp_ms.__getitem__)
        consider("layers unbalanced between stages", f"stage_breakdown: stage {slow} COMP {stage_comp_ms[slow]:.2f} "
                 f"ms, stages' median {float(np.median(list(stage_comp_ms.values()))):.2f} ms",
                 "schedule.stage_layers: ppb", replace(cfg, schedule=replace(s, stage_layers="ppb", layer_offset=None)))
    if p.pp > 1 and p.micro_batch > 1 and pp_wait_share > WAIT_SHARE:
        consider("pipeline bubble", f"rank_step_breakdown: PP_WAIT {100 * pp_wait_share:.0f}% of the step",
                 f"parallel.micro_batch: {p.micro_batch // 2} ({2 * p.micro_batches} micro-batches)",
                 replace(cfg, parallel=replace(p, micro_batch=p.micro_batch // 2)))
    if p.pp > 1 and pp_wait_share > WAIT_SHARE:
        for kind, vpp in (("interleaved", 2), ("zb-h1", 1)):
            if kind != s.kind:
                consider(f"pipeline bubble: schedule {kind}", f"rank_step_breakdown: PP_WAIT {100 * pp_wait_share:.0f}%"
                         " of the step", f"schedule.kind: {kind}" + (f", parallel.vpp: {vpp}" if vpp > 1 else ""),
                         replace(cfg, schedule=replace(s, kind=kind), parallel=replace(p, vpp=vpp)))
    limit = cfg.hardware.hbm_gb * 1e9
    if peak_bytes is not None and peak_bytes < HEADROOM * limit:
        evidence = (f"memory: peak {peak_bytes / 1e9:.1f} GB of {cfg.hardware.hbm_gb:g} GB "
                    f"({100 * peak_bytes / limit:.0f}%)")
        if s.recompute.kind != "none":
            consider("memory headroom: recompute less", evidence, "schedule.recompute: none",
                     replace(cfg, schedule=replace(s, recompute=replace(s.recompute, kind="none"))))
        if p.global_batch % (2 * p.micro_batch * p.dp) == 0:
            consider("memory headroom: larger micro-batches", evidence, f"parallel.micro_batch: {2 * p.micro_batch}",
                     replace(cfg, parallel=replace(p, micro_batch=2 * p.micro_batch)))
    best = search.search(cfg, top=1).best
    if best:
        q = best[0].config.parallel
        schedule = best[0].config.schedule
        consider("a faster layout", f"measured step {measured_step_ms:.2f} ms", f"tp{q.tp} cp{q.cp} pp{q.pp} dp{q.dp} "
                 f"ep{q.ep} vpp{q.vpp} mb{q.micro_batch} {schedule.kind} recompute:{schedule.recompute.kind}",
                 best[0].config)
    return rows
