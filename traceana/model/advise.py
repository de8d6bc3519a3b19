"""Advise: ranked findings, each with its measured evidence, a concrete change and the gain what-if predicts for it
(DESIGN §8). No finding without evidence from a view, no gain without a replayed prediction and its error bar.
Each finding's evidence names the view it comes from and where the time lies (ranks, ops, kernels).

Findings looked for, on one step (the second, or the only one), one function each:
- host-bound idle (:func:`host_bound`): IDLE is a large share of the step and the device waited on launches ->
  ``host=0``, every launch at once: the upper bound, which no launch mechanism passes; and ``host=capturable:0``,
  what CUDA graphs of the steady forward / backward remove: the host time from one launch to the next within a
  step, outside the optimizer (``Optimizer.*`` annotations) and data loading (``enumerate(DataLoader*``, and the
  host time before a step's first launch), never across a host synchronization (``syncs``), so its gain is at most
  host=0's;
- exposed communication per dim (:func:`exposed`): a dim's WAIT share -> that dim's transfers 2x faster; for DP
  (gradients, which nothing in the step consumes at once) sent in several buckets, the buckets before the last
  overlapped with the backward (``overlap=DP:backward``; its evidence the measured buckets), and where some of it
  already runs beside compute, also fully overlapped (``overlap=DP``, the bound); OTHER_WAIT (a dim no layout or
  process group names) -> ``dim=UNKNOWN:0.5``, its evidence the ops behind it and what would name the dim; EP's
  evidence the load behind it (each rank's AllToAll bytes) and the ranks it waits for;
- straggler ranks (:func:`stragglers`): stragglers view, COMP above the group's median -> each such rank (and all of
  them) to the median;
- slow process groups and links (:func:`slow_links`): comm slow links -> the group at its peers' bandwidth
  (``pg=``); a rank pair's messages -> that link at its peers' (``link=A-B``);
- straggler stage (:func:`straggler_stage`): the stage with the largest mean COMP -> ``stage=P:median``;
- kernels below their roof (:func:`kernels`): the roofline's op shapes ranked by the time bringing them to their
  target share of the roof would save (their time x (1 - achieved / target)); the target is what this run's own best
  op shape of the same bound (compute or memory) reaches (:func:`roof_targets`), or the user's ``--roof-target``;
  the first ``KERNEL_TOP`` worth at least ``KERNEL_SHARE`` of the step priced with ``kernel=PATTERN:roof=TARGET``
  on the kernels only that op shape launches.
With the job's estimator config, also what only the estimator can predict (:func:`estimator_findings`). The step's
length is the median rank's TOTAL (the ranks of one job start their steps together, so their TOTALs agree up to
where each rank's window is cut); a gain is measured minus predicted step, in ms.
"""

from __future__ import annotations

from collections import Counter

import duckdb
import numpy as np
import polars as pl

from traceana import store
from traceana.analyses import critical_path
from traceana.errors import TraceanaError
from traceana.estimator import config
from traceana.model import predict, whatif
from traceana.model.graph import Graph
from traceana.model.intervals import Interval

IDLE_SHARE = 0.2      # IDLE above this share of the step is worth a finding
WAIT_SHARE = 0.05     # a dim's exposed wait above this share
STRAGGLER_PCT = 5.0   # COMP this far above the group's median (and a rank's EP bytes this far above the median)
OVERLAPPABLE = 0.05   # the share of DP communication that already runs beside compute, for an overlap what-if
SLOW_LINK_PCT = 20.0  # a process group this far below its peers' median bandwidth
HEADROOM = 0.7        # a measured peak below this share of the device's memory leaves room
INFERRED = "the config inferred from the trace"  # a config's source when advise inferred it (see predict)
KERNEL_TOP = 3        # op shapes priced, by the time reaching their target share of the roof would save
KERNEL_SHARE = 0.01   # ... each saving at least this share of the step; an op shape sets its bound's target with
                      # at least this share of the run's costed kernel time

Proposal = tuple[str, str, list[str]]  # (finding, evidence, changes), replayed together by :func:`findings`


def findings(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None,
             config_path: str | None = None, roof_target: float | None = None) -> tuple[int, pl.DataFrame]:
    """(step, findings: those predicted to gain first, each group by its gain's lower end): finding, evidence,
    change, predicted step and gain in ms with their interval, the error bar in ms; with ``config_path`` (the job's
    estimator YAML; else the config inferred from the trace, where it can be) also :func:`estimator_findings`;
    ``roof_target``: the percent of its roof every kernel is priced at (default: :func:`roof_targets`)."""
    from traceana.model.intervals import platform_of

    if roof_target is not None:
        whatif.roof_percent(roof_target, f"--roof-target {roof_target:g}")
    step = critical_path.checked_step(con, run_id, step)
    if config_path is not None:  # refuse a config that does not describe the run before any search
        from traceana.model.compare import check_matches

        cfg = config.load(config_path)
        check_matches(con, run_id, cfg)
    else:
        cfg = _inferred(con, run_id)
    platform = platform_of(con, run_id)
    # read here, by the stragglers view and by the what-if's baseline: computed once (1,024 ranks: ~11 s a time)
    store.materialize(con, "rank_step_breakdown", run_id)
    measured = con.sql("SELECT * FROM rank_step_breakdown WHERE run_id = $run AND step = $step",
                       params={"run": run_id, "step": step}).pl()
    total = float(measured["TOTAL_ns"].median())
    mean = measured.select(pl.exclude("run_id", "rank", "tp", "cp", "ep", "dp", "pp", "step").mean()).row(0, named=True)
    stages = measured.group_by("pp").agg(pl.col("COMP_ns").mean()).drop_nulls("pp").sort("COMP_ns", descending=True)
    proposed = [*host_bound(con, run_id, mean), *exposed(con, run_id, step, measured, mean),
                *stragglers(con, run_id), *slow_links(con, run_id), *straggler_stage(stages),
                *kernels(con, run_id, step, total, roof_target)]
    rows: list[dict] = []
    if proposed:
        base = whatif.baseline(con, run_id, step)
        parsed = [[whatif.parse(c) for c in changes] for _, _, changes in proposed]
        g, frames, _ = whatif.whatif_runs(con, run_id, parsed, base, step=step)
        for (finding, evidence, changes), frame, changed in zip(proposed, frames, parsed, strict=True):
            interval = whatif.step_interval(base, frame, changed, platform)
            rows.append({"finding": finding, "evidence": evidence, "change": " ".join(changes),
                         "measured_step_ms": total / 1e6, **_row(total / 1e6, interval),
                         "error_bar_ms": float(frame["error_bar_ms"].max()), "graph": _graph_note(g)})
    if cfg is not None:
        stage_comp = {int(k): v / 1e6 for k, v in zip(stages["pp"], stages["COMP_ns"], strict=True)}
        peak = con.execute("SELECT max(greatest(allocated_bytes, coalesce(reserved_bytes, 0))) FROM memory "
                           "WHERE run_id = ?", [run_id]).fetchall()[0][0]
        rows += estimator_findings(con, run_id, cfg, total / 1e6, stage_comp,
                                   mean["PP_WAIT_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0, peak)
    frame = pl.DataFrame(rows, schema={"finding": pl.String, "evidence": pl.String, "change": pl.String,
                                       "measured_step_ms": pl.Float64, "predicted_step_ms": pl.Float64,
                                       "low": pl.Float64, "high": pl.Float64, "level": pl.Float64,
                                       "gain_ms": pl.Float64, "gain_low_ms": pl.Float64, "gain_high_ms": pl.Float64,
                                       "sources": pl.Object, "error_bar_ms": pl.Float64, "graph": pl.String})
    # ranked by what is surely gained, the lower end of the gain's interval; a finding predicted to slow the step
    # after every one predicted to speed it (a wide interval's lower end favours the smallest changes)
    return step, frame.sort([pl.col("gain_ms") > 0, "gain_low_ms"], descending=True)


def host_bound(con: duckdb.DuckDBPyConnection, run_id: str, mean: dict) -> list[Proposal]:
    """IDLE above ``IDLE_SHARE`` of the step on a run with launch records: ``host=0`` (the upper bound) and
    ``host=capturable:0`` (CUDA graphs over the steady forward / backward; the rule in the module doc)."""
    idle = mean["IDLE_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0
    launched = con.execute("SELECT count(launch_ns) FROM device_events WHERE run_id = ?", [run_id]).fetchall()[0][0]
    if idle <= IDLE_SHARE or not launched:
        return []
    evidence = (f"rank_step_breakdown: IDLE {mean['IDLE_ns'] / 1e6:.2f} of {mean['TOTAL_ns'] / 1e6:.2f} ms "
                f"({100 * idle:.0f}%) per rank; kernels launched as the device ran dry")
    return [("host-bound idle", f"{evidence}; upper bound: every launch at once, which no launch mechanism passes",
             ["host=0"]),
            ("host-bound idle: CUDA graphs", f"{evidence}; CUDA graphs of the forward / backward remove the host "
             "time between a step's launches, not the optimizer's, data loading's or a synchronization's (syncs)",
             ["host=capturable:0"])]


def exposed(con: duckdb.DuckDBPyConnection, run_id: str, step: int, measured: pl.DataFrame,
            mean: dict) -> list[Proposal]:
    """Each dim whose exposed wait is above ``WAIT_SHARE`` of the step: its transfers 2x faster (OTHER_WAIT:
    ``dim=UNKNOWN``), and for DP already partly beside compute, fully overlapped."""
    out: list[Proposal] = []
    for part, dim in (("MP_WAIT", "TP"), ("CP_WAIT", "CP"), ("EP_WAIT", "EP"), ("DP_WAIT", "DP"), ("PP_WAIT", "PP"),
                      ("OTHER_WAIT", "UNKNOWN")):
        share = mean[f"{part}_ns"] / mean["TOTAL_ns"] if mean["TOTAL_ns"] else 0
        if share <= WAIT_SHARE:
            continue
        evidence = (f"rank_step_breakdown: {part} {mean[f'{part}_ns'] / 1e6:.2f} ms ({100 * share:.0f}% of the "
                    "step) exposed per rank")
        if dim == "UNKNOWN":
            out.append(("exposed communication of unknown dim", evidence + _unknown_dim(con, run_id, step),
                        ["dim=UNKNOWN:0.5"]))
            continue
        if dim == "EP":
            evidence += _ep_load(con, run_id, step, measured)
        buckets, bucketed = _dp_buckets(con, run_id, step) if dim == "DP" else ("", False)
        out.append((f"exposed {dim} communication", evidence + buckets, [f"dim={dim}:0.5"]))
        if bucketed:
            out.append(("exposed DP communication, overlapped with the backward", f"{evidence}{buckets}; "
                        "the buckets before each step's last run beside the backward, the last stays exposed",
                        ["overlap=DP:backward"]))
        overlapped = _dp_overlapped(con, run_id, step) if dim == "DP" else 0.0
        if overlapped > OVERLAPPABLE:
            # only gradient sync can run beside other work (TP, CP, EP, PP outputs are consumed next), and only
            # where the job already runs it beside compute (buckets on their own stream); a job that syncs
            # gradients in one blocking call needs a code change the graph cannot predict
            out.append(("exposed DP communication, overlapped with compute", f"{evidence}; "
                        f"{100 * overlapped:.0f}% of it already runs beside compute (step_segments)", ["overlap=DP"]))
    return out


def _unknown_dim(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> str:
    """Where OTHER_WAIT lies: per op, its calls, time and exposed time in the step (mean per rank; collectives of no
    known dim, and communication kernels with no collective record), and what would name the dim."""
    ops = con.execute("""
        WITH comm AS (
            SELECT e.rank, e.start_ns, e.end_ns, coalesce(c.op, 'unrecorded') AS op, c.event_id IS NULL AS bare
            FROM device_events e
            JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns
                               AND e.start_ns < w.end_ns
            LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
            WHERE e.run_id = $run AND w.step = $step AND e.category = 'comm' AND coalesce(c.dim, 'UNKNOWN') = 'UNKNOWN'
        ), exposed AS (
            SELECT m.op, sum(least(m.end_ns, s.end_ns) - greatest(m.start_ns, s.start_ns)) AS ns
            FROM comm m JOIN step_segments s ON s.run_id = $run AND s.rank = m.rank AND s.step = $step
                 AND s.other AND NOT s.busy AND s.start_ns < m.end_ns AND s.end_ns > m.start_ns
            GROUP BY m.op
        ), ranks AS (SELECT count(DISTINCT rank) AS n FROM step_windows WHERE run_id = $run AND step = $step)
        SELECT m.op, count(*) / any_value(r.n), sum(m.end_ns - m.start_ns) / any_value(r.n) / 1e6,
               coalesce(any_value(x.ns), 0) / any_value(r.n) / 1e6, bool_or(m.bare)
        FROM comm m CROSS JOIN ranks r LEFT JOIN exposed x USING (op)
        GROUP BY m.op ORDER BY 4 DESC, 1""", {"run": run_id, "step": step}).fetchall()
    world, profiled, groups = con.execute(
        "SELECT any_value(world_size), (SELECT count(DISTINCT rank) FROM ranks WHERE run_id = $run), "
        "(SELECT count(*) FROM process_groups WHERE run_id = $run) FROM runs WHERE run_id = $run",
        {"run": run_id}).fetchall()[0]
    behind = ", ".join(f"{op} {calls:g} calls {ms:.2f} ms ({exposed_ms:.2f} ms exposed)" + (
        " (no collective record: not priced)" if bare else "") for op, calls, ms, exposed_ms, bare in ops)
    why = [f"{profiled} of {world} ranks profiled" if world and profiled < world else "",
           "the trace names no process groups" if not groups else ""]
    why_text = "; ".join(w for w in why if w) or "no layout given"
    return (f"; behind it (collectives, step_segments; exposed: while it ran): {behind}; its dim is unknown "
            f"({why_text}): ingest again with --layout, or profile all ranks, to name it")


def _size(n: float) -> str:
    from traceana.render.units import BINARY_BYTES, unit_for

    name, factor, _ = unit_for(n, BINARY_BYTES)
    return f"{n / factor:g} {name}"


def _ep_load(con: duckdb.DuckDBPyConnection, run_id: str, step: int, measured: pl.DataFrame) -> str:
    """The load behind EP_WAIT: the ranks whose AllToAll bytes in the step are above the median by more than
    ``STRAGGLER_PCT`` (hot: their experts got more tokens), each rank's calls by size, which ranks hold the wait,
    and the hot ranks' COMP excess from the stragglers view; empty when no rank is hot."""
    load = con.sql("""
        SELECT c.rank, sum(c.bytes) AS bytes, list(c.bytes ORDER BY c.bytes) AS sizes
        FROM collectives c
        JOIN device_events e ON e.run_id = c.run_id AND e.rank = c.rank AND e.event_id = c.event_id
        JOIN step_windows w ON w.run_id = c.run_id AND w.rank = c.rank AND e.start_ns >= w.start_ns
                           AND e.start_ns < w.end_ns
        WHERE c.run_id = $run AND w.step = $step AND c.op = 'AllToAll' AND split_part(c.dim, '-', 1) = 'EP'
              AND c.bytes IS NOT NULL
        GROUP BY c.rank ORDER BY c.rank""", params={"run": run_id, "step": step}).pl()
    if load.height < 2:
        return ""
    median = float(load["bytes"].median())
    hot = load.filter(pl.col("bytes") > median * (1 + STRAGGLER_PCT / 100))
    if hot.is_empty():
        return ""

    def calls(sizes: pl.Series) -> str:
        counted = sorted(Counter(sizes.to_list()).items())
        return " + ".join(f"{k}×{_size(s)}" if k > 1 else _size(s) for s, k in counted)

    def names(ranks: list[int]) -> str:
        return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"

    groups = (load.with_columns(pl.col("sizes").map_elements(calls, return_dtype=pl.String).alias("calls"))
              .group_by("bytes", "calls").agg(pl.col("rank").sort()).sort("bytes", descending=True))
    each = "; ".join(f"{names(r)} {_size(b)} ({c})" for b, c, r in groups.iter_rows())
    hot_ranks = hot["rank"].to_list()
    cold = load.filter(~pl.col("rank").is_in(hot_ranks))
    wait = dict(zip(measured["rank"], measured["EP_WAIT_ns"] / 1e6, strict=True))
    excess = dict(con.execute("SELECT rank, COMP_excess_pct FROM stragglers WHERE run_id = ?", [run_id]).fetchall())
    late = [r for r in hot_ranks if excess.get(r, 0) > STRAGGLER_PCT]
    # the calls that differ between a hot and a cold rank carry the routed tokens: their sizes' ratio is the load's
    a, b = Counter(hot["sizes"][0].to_list()), Counter(cold["sizes"][0].to_list()) if cold.height else Counter()
    more, less = a - b, b - a
    tokens = (f"; the calls that differ, {_size(max(more))} against {_size(max(less))}: {max(more) / max(less):.1f}x "
              "the tokens") if more and less and max(less) else ""
    text = (f"; the load behind it (collectives, AllToAll bytes received in the step): {each}: {names(hot_ranks)} "
            f"{float(hot['bytes'].mean()) / float(cold['bytes'].mean() or 1):.1f}x the others{tokens}; the wait "
            f"lies on {names(cold['rank'].to_list())} ("
            + ", ".join(f"{wait.get(r, 0):.2f}" for r in cold["rank"]) + " ms EP_WAIT), waiting for the hot "
            + names(hot_ranks) + " (" + ", ".join(f"{wait.get(r, 0):.2f}" for r in hot_ranks) + " ms)")
    if late:
        text += (", whose COMP is " + ", ".join(f"+{excess[r]:.1f}%" for r in late) + " (stragglers): the finding "
                 f"'straggler {names(late)}' prices balancing them, which this wait follows")
    return text


def stragglers(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Proposal]:
    """Ranks whose COMP is over ``STRAGGLER_PCT`` above their group's median (stragglers view): each, and all
    together, to the median."""
    late = con.sql("SELECT rank, pp, COMP_excess_pct FROM stragglers WHERE run_id = ? AND COMP_excess_pct > ? "
                   "ORDER BY COMP_excess_pct DESC", params=[run_id, STRAGGLER_PCT]).pl()
    out: list[Proposal] = [(f"straggler rank {rank}", f"stragglers: COMP {excess:.1f}% above its group's median",
                            [f"rank={rank}:median"])
                           for rank, excess in zip(late["rank"], late["COMP_excess_pct"], strict=True)]
    if late.height > 1:
        ranks = late["rank"].to_list()
        out.append((f"straggler ranks {', '.join(map(str, ranks))}", "stragglers: " + ", ".join(
            f"rank {r} +{e:.1f}%" for r, e in zip(ranks, late["COMP_excess_pct"], strict=True)),
            [f"rank={r}:median" for r in ranks]))
    return out


def slow_links(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Proposal]:
    """Process groups (comm slow links, per dim and op) and rank pairs (their recorded point-to-point messages, per
    dim) over ``SLOW_LINK_PCT`` below their peers' median bandwidth: the group at its peers' (``pg=``), the pair's
    link at its peers' (``link=A-B``)."""
    from traceana.analyses.comm import by_group, matrix
    from traceana.analyses.comm import slow_links as below_peers

    pairs = matrix(con, run_id).filter(pl.col("assumed_bytes") < pl.col("bytes"))  # messages, not an even split
    slow = below_peers(pairs, by_group(con, run_id), SLOW_LINK_PCT).filter(pl.col("who").is_not_null())
    out: list[Proposal] = []
    groups = slow.filter(pl.col("what") == "group")["who"]  # 'pg 2 [2, 3]'
    seen = {"-".join(who.split(" ", 2)[2].strip("[]").split(", ")) for who in groups}  # a two-rank group's pair
    for row in slow.iter_rows(named=True):
        factor = row["bandwidth_GBps"] / row["median_GBps"]
        below = (f"{row['bandwidth_GBps']:.1f} GB/s{' busbw' if row['what'] == 'group' else ''}, "
                 f"{-row['vs_median_pct']:.0f}% below the median of its {row['dim']} peers ({row['median_GBps']:.1f} "
                 "GB/s)")
        if row["what"] == "group":  # a group the store names
            pg = row["who"].split()[1]
            out.append((f"slow {row['dim']} group {pg}", f"comm slow links: {row['op']} on pg {pg} at {below}: "
                        "check its links", [f"pg={pg}:{factor:.3f}"]))
            continue
        link = "-".join(sorted(row["who"].split(" -> "), key=int))
        if link not in seen:  # one finding a pair, its slower direction first
            seen.add(link)
            out.append((f"slow link {link}", f"comm_matrix: {row['who']} messages at {below}: check that link",
                        [f"link={link}:{factor:.3f}"]))
    return out


def straggler_stage(stages: pl.DataFrame) -> list[Proposal]:
    """The stage with the largest mean COMP (``stages``: pp, COMP_ns, slowest first), over ``STRAGGLER_PCT`` above
    the others' median: ``stage=P:median`` (what rebalancing its layers buys)."""
    if stages.height < 2:
        return []
    slow, comp = stages.row(0)
    others = float(stages["COMP_ns"][1:].median())
    if comp <= others * (1 + STRAGGLER_PCT / 100):
        return []
    return [(f"straggler stage {slow}", f"stage_breakdown: stage {slow} mean COMP {comp / 1e6:.2f} ms, "
             f"{100 * (comp / others - 1):.0f}% above the other stages' median {others / 1e6:.2f} ms: rebalance its "
             "layers", [f"stage={slow}:median"])]


def roof_targets(roof: pl.DataFrame) -> pl.DataFrame:
    """Per bound (compute, memory), the share of its roof the run's own best op shape of that bound reaches: the
    ceiling this device showed in this very run (bound, target_pct, by: the op shape that sets it). Only op shapes
    with at least ``KERNEL_SHARE`` of the costed kernel time count (a few short calls time poorly), and none above
    its roof (data a cache served). An upper bound on tuning: an op of another family or shape may not get there."""
    return (roof.filter((pl.col("roof_pct") <= 100) & (pl.col("total_ms") >= KERNEL_SHARE * roof["total_ms"].sum()))
            .sort("roof_pct", descending=True).group_by("bound", maintain_order=True).first()
            .select("bound", pl.col("roof_pct").alias("target_pct"),
                    pl.format("{} ({}) at {}%", "op", "shapes", pl.col("roof_pct").round(1)).alias("by")))


def kernels(con: duckdb.DuckDBPyConnection, run_id: str, step: int, total_ns: float,
            roof_target: float | None = None) -> list[Proposal]:
    """Op shapes below their target share of the roof (the roofline, `traceana kernels --roofline`; the target
    :func:`roof_targets`' for their bound, or ``roof_target`` percent for all), ranked by the time reaching it
    would save in the step: time x (1 - roof_pct / target). The first ``KERNEL_TOP`` that save at least
    ``KERNEL_SHARE`` of the step are priced with ``kernel=*NAME*:roof=TARGET`` on each kernel only that op shape
    launches (every event the pattern matches is one of its calls'); one whose kernels all run for other ops too is
    named, not priced. The evidence also gives the step's kernel time the roofline cannot cost."""
    try:  # read by the roofline and twice by :func:`_priced_kernels`: computed once (1,024 copies of a real
        store.materialize(con, "op_kernels", run_id)  # rank: 25 s, against 16-24 s a read)
    except duckdb.CatalogException:  # a store written before event_ops: no roofline to rank by
        return []
    try:
        return _priced_kernels(con, run_id, step, total_ns, roof_target)
    finally:  # its rows held DuckDB memory through the graph's build, the command's peak
        store.forget(con, "op_kernels")


def _priced_kernels(con: duckdb.DuckDBPyConnection, run_id: str, step: int, total_ns: float,
                    roof_target: float | None) -> list[Proposal]:
    """:func:`kernels` over op_kernels."""
    import re

    from traceana.analyses import roofline

    try:
        roof = roofline.measure(con, run_id)
    except TraceanaError:  # no shapes (Nsight, Ascend, record_shapes off): nothing to rank
        return []
    params = {"run": run_id, "step": step}
    in_step = con.sql("""
        SELECT k.op, k.input_dims, k.kernel, sum(k.kernel_ns) / count(DISTINCT k.rank) AS ns,
               count(*) / count(DISTINCT k.rank) AS calls
        FROM op_kernels k JOIN step_windows w ON w.run_id = k.run_id AND w.rank = k.rank
             AND k.start_ns >= w.start_ns AND k.start_ns < w.end_ns
        WHERE k.run_id = $run AND w.step = $step GROUP BY ALL""", params=params).pl()
    keys = ["op", "input_dims", "kernel"]
    targets = (roof_targets(roof.frame) if roof_target is None else
               pl.DataFrame({"bound": ["compute", "memory"], "target_pct": float(roof_target),
                             "by": "--roof-target"}))
    rows = (roof.frame.join(targets, on="bound").filter(pl.col("roof_pct") < pl.col("target_pct"))
            .join(in_step, on=keys, nulls_equal=True, suffix="_step")
            .with_columns((pl.col("ns") * (1 - pl.col("roof_pct") / pl.col("target_pct"))).alias("saved"))
            .filter(pl.col("saved") >= KERNEL_SHARE * total_ns).sort("saved", descending=True).head(KERNEL_TOP))
    if rows.is_empty():
        return []
    kernel_ns = _kernel_ns(con, params)
    costed_ns = float(in_step.join(roof.frame.select(keys), on=keys, nulls_equal=True)["ns"].sum())
    uncosted = (f"; kernels the roofline cannot cost (no cost model, shapes or launching op): "
                f"{(kernel_ns - costed_ns) / 1e6:.3f} of the step's {kernel_ns / 1e6:.3f} ms of compute kernels "
                f"({100 * (1 - costed_ns / kernel_ns):.0f}%)") if kernel_ns else ""
    launched = con.sql("""
        SELECT k.op, k.input_dims, k.kernel, n.short_name, e.name, count(*) AS n, sum(e.end_ns - e.start_ns) AS ns
        FROM op_kernels k JOIN event_ops o ON o.run_id = k.run_id AND o.rank = k.rank AND o.op_id = k.op_id
        JOIN device_events e ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.event_id
        JOIN kernel_names n ON n.run_id = e.run_id AND n.name = e.name
        WHERE k.run_id = $run AND e.category = 'compute' GROUP BY ALL""", params={"run": run_id}).pl()
    work = con.sql("SELECT name, count(*) AS n FROM device_events WHERE run_id = $run AND category IN "
                   f"{tuple(whatif.WORK)} GROUP BY name", params={"run": run_id}).pl()
    out: list[Proposal] = []
    unpriced: list[str] = []
    for row in rows.iter_rows(named=True):
        mine = launched.filter(*(pl.col(k).eq_missing(row[k]) for k in keys))
        counts = mine.group_by("name").agg(pl.col("n").sum().alias("len"))
        target = row["target_pct"]
        patterns, covered = [], 0
        for short in sorted(mine["short_name"].unique().to_list()):
            name = short.rsplit("::", 1)[-1]  # a short name drops '(anonymous namespace)::' the full one has
            if re.search(r"[][*?]", name):
                continue
            match = whatif.kernel_pattern(f"*{name}*").match
            hit = work.filter(pl.col("name").is_in([n for n in work["name"].to_list() if match(n)]))
            if hit.height and hit.join(counts, on="name", how="left")["len"].eq_missing(hit["n"]).all():  # only its
                patterns.append(f"kernel=*{name}*:roof={target:.1f}")
                covered += int(mine.filter(pl.col("short_name") == short)["ns"].sum())
        what = f"{row['op']} ({row['shapes']})"
        measured = (f"roofline (kernels --roofline): {what} at {row['roof_pct']:.1f}% of its {row['bound']} roof, "
                    f"{row['ns'] / 1e6:.3f} ms per step in {row['calls_step']:g} calls, longest kernel "
                    f"{row['kernel']}")
        if not patterns:
            unpriced.append(f"{what} at {row['roof_pct']:.1f}%, {row['ns'] / 1e6:.3f} ms per step")
            continue
        reach = (f"{target:g}% of the roof (--roof-target)" if roof_target is not None else
                 f"{target:.1f}% of the roof, what this run's best {row['bound']}-bound op reaches: {row['by']}")
        share = 100 * covered / mine["ns"].sum()
        out.append((f"kernel below its roof: {row['op']}", f"{measured}; its kernels at {row['roof_pct'] / target:.3f}x"
                    f" their time bring it to {reach} ({share:.0f}% of its kernel time; kernels other ops launch too "
                    "are kept)", patterns))
    if out:  # what the ranking could not see or price, once
        finding, evidence, changes = out[0]
        also = ("; also below the roof, not priced (their kernels run for other ops too): " + "; ".join(unpriced)
                if unpriced else "")
        out[0] = (finding, evidence + uncosted + also, changes)
    return out


def _kernel_ns(con: duckdb.DuckDBPyConnection, params: dict) -> float:
    """The step's compute kernel time per rank, in ns (``params``: run, step)."""
    ns = con.execute("""
        SELECT sum(e.end_ns - e.start_ns) / count(DISTINCT e.rank) FROM device_events e
        JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns
                           AND e.start_ns < w.end_ns
        WHERE e.run_id = $run AND w.step = $step AND e.category = 'compute'""", params).fetchall()[0][0]
    return float(ns or 0.0)


def _row(measured_ms: float, interval: Interval) -> dict:
    """A finding's predicted step and gain with their interval (the gain's ends are the step's, mirrored)."""
    return {"predicted_step_ms": interval.value, "low": interval.low, "high": interval.high, "level": interval.level,
            "gain_ms": measured_ms - interval.value, "gain_low_ms": measured_ms - interval.high,
            "gain_high_ms": measured_ms - interval.low, "sources": interval.sources}


def split(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(findings whose gain's interval reaches above zero, those checked with no gain possible at its level)."""
    return frame.filter(pl.col("gain_high_ms") > 0), frame.filter(pl.col("gain_high_ms") <= 0)


def _dp_buckets(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> tuple[str, bool]:
    """(evidence, whether the gradients go in several buckets): the step's DP collectives per rank (mean count,
    sizes, transfer time before the last bucket and the last's), against the compute they would run beside (the
    backward's where the trace marks it, else the step's)."""
    rows = con.execute("""
        WITH dp AS (
            SELECT c.rank, c.bytes, e.start_ns, e.end_ns - e.start_ns AS ns,
                   row_number() OVER (PARTITION BY c.rank ORDER BY e.start_ns DESC) = 1 AS last
            FROM collectives c
            JOIN device_events e ON e.run_id = c.run_id AND e.rank = c.rank AND e.event_id = c.event_id
            JOIN step_windows w ON w.run_id = c.run_id AND w.rank = c.rank AND e.start_ns >= w.start_ns
                               AND e.start_ns < w.end_ns
            WHERE c.run_id = $run AND w.step = $step AND split_part(c.dim, '-', 1) = 'DP'
        ), compute AS (
            SELECT sum(e.end_ns - e.start_ns) FILTER (WHERE s.phase = 'backward') AS backward,
                   sum(e.end_ns - e.start_ns) AS comp
            FROM device_events e
            JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns
                               AND e.start_ns < w.end_ns
            LEFT JOIN event_scopes s ON s.run_id = e.run_id AND s.rank = e.rank AND s.event_id = e.event_id
            WHERE e.run_id = $run AND w.step = $step AND e.category = 'compute'
        )
        SELECT count(*) / count(DISTINCT d.rank), min(d.bytes), max(d.bytes),
               sum(d.ns) FILTER (WHERE NOT d.last) / count(DISTINCT d.rank) / 1e6,
               sum(d.ns) FILTER (WHERE d.last) / count(DISTINCT d.rank) / 1e6,
               any_value(c.backward) / count(DISTINCT d.rank) / 1e6, any_value(c.comp) / count(DISTINCT d.rank) / 1e6
        FROM dp d CROSS JOIN compute c""", {"run": run_id, "step": step}).fetchall()[0]
    calls, low, high, before_ms, last_ms, backward_ms, comp_ms = rows
    if not calls:
        return "", False
    sizes = _size(low) if low == high else f"{_size(low)} to {_size(high)}" if low is not None else "unknown size"
    if calls < 2:
        return (f"; its gradients go in one {sizes} call a step (collectives): bucketing it (DDP's bucket_cap_mb) "
                "would let all but the last bucket run beside the backward, which this trace has no buckets to "
                "price"), False
    beside = (f"{backward_ms:.2f} ms of backward compute" if backward_ms else
              f"{comp_ms or 0:.2f} ms of the step's compute (the trace does not mark the backward)")
    return (f"; the gradients go in {calls:g} buckets a step of {sizes} (collectives): {before_ms:.2f} ms of "
            f"transfer before the last, {last_ms:.2f} ms the last, per rank, against {beside}"), True


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


def _inferred(con: duckdb.DuckDBPyConnection, run_id: str) -> config.Config | None:
    """The job's config as `predict` without --config infers it from the trace, or None where the trace cannot say
    (no hardware profile for its device, no layout for its ranks, no recorded shapes): then only the graph's
    findings, as before a config was given."""
    from traceana.analyses.job import infer

    try:
        return config.from_dict(infer(con, run_id).raw, INFERRED)
    except TraceanaError:
        return None


def set_specs(cfg: config.Config, candidate: config.Config) -> list[str]:
    """The `predict --set` arguments (SECTION.KEY=VALUE, the value as YAML) that turn ``cfg`` into ``candidate``:
    every field of parallel and schedule (recompute's within it) that differs."""
    import dataclasses

    import yaml

    def text(value: object) -> str:
        value = list(value) if isinstance(value, tuple) else value
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()

    def diff(path: str, a: object, b: object) -> list[str]:
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            return [spec for f in dataclasses.fields(a)
                    for spec in diff(f"{path}.{f.name}", getattr(a, f.name), getattr(b, f.name))]
        return [] if a == b else [f"{path}={text(b)}"]

    return diff("parallel", cfg.parallel, candidate.parallel) + diff("schedule", cfg.schedule, candidate.schedule)


def estimator_findings(con: duckdb.DuckDBPyConnection, run_id: str, cfg: config.Config, measured_step_ms: float,
                       stage_comp_ms: dict[int, float], pp_wait_share: float,
                       peak_bytes: int | None = None) -> list[dict]:
    """What the graph cannot predict, from the estimator: each candidate that changes the graph itself (layers
    rebalanced between stages with seed 003's PPB, more and smaller micro-batches, another schedule, with memory to
    spare less recompute or larger micro-batches, the fastest layout `search` finds that fits). The estimator only
    screens (a candidate it says is no faster, or that does not fit, is dropped); each kept one is priced by
    :func:`predict.predict` from this run, so its interval is predict's (calibrated per kind of change), scaled from
    predict's step (the stages' mean over the run) to this step's median rank. Each change is written as the
    ``--set`` arguments that make it (:func:`set_specs`): `traceana predict --set ...` reproduces it."""
    from dataclasses import replace

    from traceana.estimator import estimate, search

    now = estimate.estimate(cfg)
    rows: list[dict] = []
    seen: list[tuple] = []  # (parallel, schedule) of the candidates kept: one finding a candidate
    source = ("; config inferred from the trace (as `predict` without --config; its notes say what was assumed)"
              if cfg.source == INFERRED else "")

    def consider(finding: str, evidence: str, candidate: config.Config) -> None:
        try:
            config.validate(candidate)
            new = estimate.estimate(candidate)
        except TraceanaError:
            return
        key = (candidate.parallel, candidate.schedule)
        if not new.fits or new.step_s >= now.step_s or key in seen:
            return
        seen.append(key)
        change = " ".join(set_specs(cfg, candidate))
        result = predict.predict(con, run_id, cfg, candidate)
        total = result.step.filter(pl.col("dim") == "TOTAL").row(0, named=True)
        peak = result.memory["predicted_B_MiB"]
        if peak is not None:  # predict scales the measured peak: a candidate it says would not fit is dropped too
            if peak * 2**20 > cfg.hardware.hbm_gb * 1e9:
                return
            evidence += f"; predicted peak memory {peak * 2**20 / 1e9:,.1f} GB of {cfg.hardware.hbm_gb:g} GB"
        scale = measured_step_ms / total["measured_A_ms"]
        interval = Interval(total["predicted_B_ms"] * scale, total["low"] * scale, total["high"] * scale,
                            total["level"], {"predict": f"{cfg.source} -> {change}, x{scale:.3f} to this step"})
        rows.append({"finding": finding, "evidence": f"{evidence}; estimator {now.step_s * 1e3:.2f} -> "
                     f"{new.step_s * 1e3:.2f} ms{source}", "change": change, "measured_step_ms": measured_step_ms,
                     **_row(measured_step_ms, interval), "error_bar_ms": (interval.high - interval.low) / 2,
                     "graph": f"predict ({predict.kind_of(cfg, candidate)} change)"})

    p, s = cfg.parallel, cfg.schedule
    if p.pp > 1 and len(stage_comp_ms) > 1 and s.stage_layers != "ppb":
        slow = max(stage_comp_ms, key=stage_comp_ms.__getitem__)
        consider("layers unbalanced between stages", f"stage_breakdown: stage {slow} COMP {stage_comp_ms[slow]:.2f} "
                 f"ms, stages' median {float(np.median(list(stage_comp_ms.values()))):.2f} ms",
                 replace(cfg, schedule=replace(s, stage_layers="ppb", layer_offset=None)))
    if p.pp > 1 and p.micro_batch > 1 and pp_wait_share > WAIT_SHARE:
        consider("pipeline bubble", f"rank_step_breakdown: PP_WAIT {100 * pp_wait_share:.0f}% of the step; "
                 f"{2 * p.micro_batches} micro-batches of {p.micro_batch // 2}",
                 replace(cfg, parallel=replace(p, micro_batch=p.micro_batch // 2)))
    if p.pp > 1 and pp_wait_share > WAIT_SHARE:
        for kind, vpp in (("interleaved", 2), ("zb-h1", 1)):
            if kind != s.kind:
                consider(f"pipeline bubble: schedule {kind}", f"rank_step_breakdown: PP_WAIT {100 * pp_wait_share:.0f}%"
                         " of the step", replace(cfg, schedule=replace(s, kind=kind), parallel=replace(p, vpp=vpp)))
    limit = cfg.hardware.hbm_gb * 1e9
    if peak_bytes is not None and peak_bytes < HEADROOM * limit:
        evidence = (f"memory: peak {peak_bytes / 1e9:.1f} GB of {cfg.hardware.hbm_gb:g} GB "
                    f"({100 * peak_bytes / limit:.0f}%)")
        if s.recompute.kind != "none":
            consider("memory headroom: recompute less", evidence,
                     replace(cfg, schedule=replace(s, recompute=replace(s.recompute, kind="none"))))
        if p.global_batch % (2 * p.micro_batch * p.dp) == 0:
            consider("memory headroom: larger micro-batches", evidence,
                     replace(cfg, parallel=replace(p, micro_batch=2 * p.micro_batch)))
    best = search.search(cfg, top=1).best
    if best:
        consider("a faster layout", f"measured step {measured_step_ms:.2f} ms; search's fastest that fits",
                 best[0].config)
    return rows
