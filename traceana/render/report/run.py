"""The sections of `traceana report --html` about one run, in SECTIONS order, after a first screen that says where
the time went and what to look at first. Each section reads the run through the Python API (traceana.api.Traces) or
the analysis modules, adds its charts and tables to the Page, and returns None when the run cannot say."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from traceana import store
from traceana.analyses import breakdown as bd
from traceana.render.colours import (
    DIM_COLORS,
    FIRST_COLOR,
    IDLE_CAUSE_COLORS,
    PART_COLORS,
    SECOND_COLOR,
    UNKNOWN_DIM_COLOR,
)
from traceana.render.report import charts
from traceana.render.report.ops import section as ops_section
from traceana.render.report.page import Page
from traceana.render.units import BINARY_BYTES, unit_for

if TYPE_CHECKING:
    from traceana.api import Traces  # which calls write(): the page reads the run through the API it serves


@dataclass
class Context:
    """What every section may read: the store, the run, the page being built and an optional job config; and,
    read once for all the sections that show them (the first screen and their own), the rank breakdown, which step
    it is, the stragglers and the idle causes."""

    traces: Traces
    run: str
    page: Page
    estimate: Path | None = None

    @cached_property
    def ranks(self) -> pl.DataFrame:
        """The typical step's breakdown per rank (`traceana breakdown`)."""
        return self.traces.breakdown(run=self.run)

    @cached_property
    def which(self) -> str:
        """Which step the breakdown is, in words."""
        return self.traces.read(self.run, lambda con, rid: bd.which_step(con, rid, None))

    @cached_property
    def stragglers(self) -> pl.DataFrame:
        """Each rank's COMP against its stage's median (`traceana stragglers`)."""
        return self.traces.stragglers(run=self.run)

    @cached_property
    def idle(self) -> pl.DataFrame:
        """IDLE per rank split by cause (`traceana idle`)."""
        return self.traces.idle(run=self.run)

    @cached_property
    def path(self) -> tuple[int, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(step, windows, intervals, segments): the critical path of the step advise reads too (the second)."""
        from traceana.analyses import critical_path as cp

        def frames(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[int, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
            step, windows, segments = cp.of_step(con, rid, None)
            return step, windows, bd.timeline(con, rid, step)[1], segments

        return self.traces.read(self.run, frames)

    @cached_property
    def span_ms(self) -> float:
        """The path's step from the first rank's start to the last rank's end (ms): the critical path's length."""
        segments = self.path[3]
        return (segments["end_ns"].max() - segments["start_ns"].min()) / 1e6

    @cached_property
    def has_stages(self) -> bool:
        """Whether the run has more than one pipeline stage."""
        return self.ranks["pp"].drop_nulls().n_unique() > 1


def _shown_parts(frame: pl.DataFrame, suffix: str = "_ms") -> list[str]:
    """TOTAL, COMP, the waits that occur and IDLE, as columns of ``frame``."""
    return [f"{p}{suffix}" for p in ("TOTAL", *bd.PARTS, "OVERLAPPED")
            if p not in bd.WAITS or frame[f"{p}{suffix}"].sum() > 0]


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    """Column names as people read them: MP_WAIT_ms -> MP_WAIT (TP) ms."""
    return frame.rename({c: c.replace("MP_WAIT", bd.label("MP_WAIT")).replace("_ms", " ms").replace("_pct", " %")
                         for c in frame.columns})


def _advice(ctx: Context) -> pl.DataFrame:
    """advise's findings whose gain can be positive (with the job config, the estimator's too), each with its gain's
    interval."""
    from traceana.model.advise import findings, split

    if ctx.estimate is None:
        return with_intervals(split(ctx.traces.advise(run=ctx.run))[0])
    return with_intervals(split(ctx.traces.read(ctx.run,
                                                lambda con, rid: findings(con, rid, None, str(ctx.estimate))[1]))[0])


def with_intervals(advice: pl.DataFrame) -> pl.DataFrame:
    """``advice`` with gain_low_ms and gain_high_ms, from the predicted step's ``low``/``high`` where the result
    carries them (with their ``level``), else the gain ± its error bar; and ``interval``, those numbers in words."""
    measured, gain, bar = pl.col("measured_step_ms"), pl.col("gain_ms"), pl.col("error_bar_ms")
    if {"low", "high"} <= set(advice.columns):
        advice = advice.with_columns((measured - pl.col("high")).alias("gain_low_ms"),
                                     (measured - pl.col("low")).alias("gain_high_ms"))
    else:
        advice = advice.with_columns((gain - bar).alias("gain_low_ms"), (gain + bar).alias("gain_high_ms"))
    level = [f" ({_level(v)})" for v in advice["level"]] if "level" in advice.columns else [""] * advice.height
    text = [f"{g:,.3f} ms [{lo:,.3f}, {hi:,.3f}]{lv}" if "low" in advice.columns else f"{g:,.3f} ± {b:,.3f} ms"
            for g, b, lo, hi, lv in zip(advice["gain_ms"], advice["error_bar_ms"], advice["gain_low_ms"],
                                        advice["gain_high_ms"], level, strict=True)]
    return advice.with_columns(pl.Series("interval", text, pl.String))


def _level(value: object) -> str:
    """An interval's level as a percentage: 0.8 and 80 both read 80%."""
    return f"{100 * value if isinstance(value, float) and value <= 1 else value:g}%"


def _steps_relation(ctx: Context, advice: pl.DataFrame) -> str:
    """The sentence that relates the first screen's step time to the other two the page shows: advise's (the
    median rank's TOTAL in one step) and the timeline's (that step's span over all ranks), with why they differ."""
    step, windows = ctx.path[0], ctx.path[1]
    if windows.height == 1:
        return f"Step {step} on the timeline below spans {ctx.span_ms:,.3f} ms, its one rank's window."
    said = []
    if not advice.is_empty():
        said.append(f"its median rank's TOTAL is {advice['measured_step_ms'][0]:,.3f} ms, the step advise's gains "
                    "start from (half the ranks took longer)")
    starts, ends = (windows[c].max() - windows[c].min() for c in ("start_ns", "end_ns"))
    said.append(f"from the first rank's start to the last rank's end it spans {ctx.span_ms:,.3f} ms (the timeline "
                f"and its critical path), at least the longest rank's TOTAL, as the ranks start the step up to "
                f"{starts / 1e6:,.3f} ms apart and end it up to {ends / 1e6:,.3f} ms apart")
    return f"Read on one step, step {step}: " + "; ".join(said) + "."


def first_screen(ctx: Context, advice: pl.DataFrame) -> str:
    """Where a step's time went (the mean rank's parts, one bar) and what to look at first: the top findings of
    advise, the largest exposed wait, the straggler and the largest idle cause."""
    ranks, which = ctx.ranks, ctx.which if ctx.which.startswith(("step", "the ")) else f"the {ctx.which}"
    total = ranks["TOTAL_ms"].mean()
    parts = [p for p in bd.PARTS if ranks[f"{p}_ms"].sum() > 0 or p == "COMP"]
    share = ", ".join(f"{bd.label(p)} {ranks[f'{p}_ms'].mean():,.3f} ms ({100 * ranks[f'{p}_ms'].mean() / total:.1f}%)"
                      for p in parts) if total else "no time measured"
    overlap = bd.run_overlap_pct(ranks)
    if overlap is not None:
        share += (f"; communication/compute overlap {overlap:.1f}% (OVERLAPPED {ranks['OVERLAPPED_ms'].mean():,.3f} ms"
                  " of the mean rank's communication ran under compute)")
    look: list[str] = []
    for finding in advice.head(3).iter_rows(named=True):
        look.append(f"<b>{html.escape(finding['finding'])}</b>: <code>{html.escape(finding['change'])}</code> would "
                    f"take the step from {finding['measured_step_ms']:,.3f} to {finding['predicted_step_ms']:,.3f} ms "
                    f"(gain {finding['interval']}; advise)")
    waits = [(ranks[f"{w}_ms"].mean(), w) for w in bd.WAITS if ranks[f"{w}_ms"].sum() > 0]
    if waits:
        ms, wait = max(waits)
        look.append(f"Largest exposed wait: <b>{bd.label(wait)}</b>, {ms:,.3f} ms per step on the mean rank "
                    f"({100 * ms / total:.1f}% of TOTAL).")
    if ctx.stragglers.height > 1:
        look.append(_stragglers(ctx))
    idle = ctx.idle
    if idle.height and idle["IDLE_ms"].sum() > 0:
        from traceana.analyses.idle import CAUSES

        cause = max(CAUSES, key=lambda c: idle[f"{c}_ms"].mean())
        look.append(f"Idle: {idle['IDLE_ms'].mean():,.3f} ms per step on the mean rank, most of it "
                    f"<b>{cause.replace('_', ' ')}</b> ({idle[f'{cause}_ms'].mean():,.3f} ms).")
    bar = charts.parts_bar({bd.label(p): ranks[f"{p}_ms"].mean() for p in parts},
                           {bd.label(p): PART_COLORS[p] for p in parts},
                           f"where the mean rank's step went ({ctx.which}); hover for each part")
    items = "".join(f"<li>{item}</li>" for item in look) or "<li>nothing stands out</li>"
    over = f"{ranks.height} rank" + ("s" if ranks.height > 1 else "")
    return (f'<section class="first" id="first"><p class="big">Step time {total:,.3f} ms</p><p>The mean rank\'s '
            f"TOTAL (a rank's TOTAL: its own step window) in {html.escape(which)}, over {over}: "
            f"{html.escape(share)}.</p><p>{html.escape(_steps_relation(ctx, advice))}</p>"
            f"{ctx.page.chart(bar)}<h3>Look at first</h3><ol>{items}</ol></section>")


def _stragglers(ctx: Context) -> str:
    """The ranks advise calls stragglers (COMP over STRAGGLER_PCT above their stage's median), largest excess first,
    or that there are none; either way why the rank with the most COMP may not be one."""
    from traceana.model.advise import STRAGGLER_PCT

    late = ctx.stragglers.sort("COMP_excess_pct", descending=True, nulls_last=True)
    over = late.filter(pl.col("COMP_excess_pct") > STRAGGLER_PCT)
    stage = " of its stage" if ctx.has_stages else ""
    if late["COMP_excess_pct"].drop_nulls().is_empty():
        return "No straggler: no rank has compute to compare."
    if over.is_empty():
        top = late.row(0, named=True)
        said = (f"No straggler: every rank's COMP is within {STRAGGLER_PCT:g}% of the median{stage} (the most above "
                f"it: rank {top['rank']}, {top['COMP_excess_pct']:+.1f}%).")
    else:
        said = (f"Stragglers, as advise finds them (COMP more than {STRAGGLER_PCT:g}% above the median{stage}): "
                + ", ".join(f"rank {r['rank']} {r['COMP_excess_pct']:+.1f}% ({r['COMP_ms']:,.3f} against "
                            f"{r['stage_median_COMP_ms']:,.3f} ms)" for r in over.iter_rows(named=True)) + ".")
    most = ctx.stragglers.sort("COMP_ms", descending=True).row(0, named=True)
    if ctx.has_stages and most["rank"] not in over["rank"].to_list():
        said += (f" Rank {most['rank']} has the most COMP ({most['COMP_ms']:,.3f} ms) but is "
                 f"{most['COMP_excess_pct']:+.1f}% against its own stage's median: its stage {most['pp']} as a whole "
                 "computes more, which is a stage's imbalance (Stragglers below), not a straggler rank.")
    return said


def summary(ctx: Context) -> str:
    run = ctx.traces.runs().filter(pl.col("run_id") == ctx.run)
    facts = run.select("run_id", "source_format", "world_size", "layout", "tool_version", "rank_source",
                       pl.col("sources").list.len().alias("sources"), "ingested_at")
    steps = ctx.traces.steps(run=ctx.run).group_by("step").agg(
        pl.len().alias("ranks"), ((pl.col("end_ns") - pl.col("start_ns")).mean() / 1e6).alias("mean_ms"),
        pl.col("from_markers").all()).sort("step")
    notes = run["notes"].to_list()[0] or []
    return (ctx.page.table(facts, "the run") + ctx.page.table(steps, "steps: ranks, mean window (ms)")
            + "".join(f"<p class=note>note: {html.escape(n)}</p>" for n in notes))


def advise(ctx: Context, advice: pl.DataFrame) -> str | None:
    """The findings `traceana advise` ranks (with the job config, the estimator's too), each with its evidence."""
    if advice.is_empty():
        return None
    bounds = [c for c in ("low", "high", "level") if c in advice.columns]
    chart = charts.gains(advice.select("finding", "change", "gain_ms", "gain_low_ms", "gain_high_ms", "interval"),
                         f"each change's predicted gain on step {ctx.path[0]}; black: its interval, numbers beside "
                         "it (hover a bar for its change)")
    return ctx.page.chart(chart) + ctx.page.table(
        advice.select("finding", "change", "predicted_step_ms", *bounds, "gain_ms", "error_bar_ms", "evidence"),
        f"measured step {advice['measured_step_ms'][0]:,.3f} ms; each change's predicted step, by "
        "gain less its error bar (what-if replays of the run's own dependency graph; estimator "
        "ratios where the graph itself would change)")


def stages(ctx: Context) -> str | None:
    """Per stage: stacked bars (click one to see its ranks) and the table; only for runs with pipeline stages."""
    if not ctx.has_stages:
        return None
    frame = ctx.traces.breakdown(by="stage", run=ctx.run)
    frame = frame.rename({c: c.replace("_mean_ms", "_ms") for c in frame.columns if c.endswith("_mean_ms")})
    shown = frame.select(pl.col("pp").alias("stage"), "ranks", *_shown_parts(frame))
    bars = charts.stacked_bars(shown, "stage", {c: charts.PART_COLUMNS[c] for c in _shown_parts(frame)[1:-1]},
                               "mean over each stage's ranks (click a stage for its ranks)", "pipeline stage",
                               pick="stage")
    return ctx.page.chart(bars) + ctx.page.table(_labelled(shown), "mean over each stage's ranks, ms per step "
                                                 "(click a row for its ranks)", pick="stage")


def ranks(ctx: Context) -> str:
    """Per rank: stacked bars and the table (click a rank for its steps), filtered by a picked stage."""
    frame = ctx.ranks.with_columns(pl.col("pp").alias("stage")).sort(pl.col("stage").fill_null(-1), "rank")
    parts = _shown_parts(frame)
    coords = [c for c in bd.COORDS if frame[c].n_unique() > 1 and c != "pp"]
    bars = charts.stacked_bars(frame, "rank", {c: charts.PART_COLUMNS[c] for c in parts[1:-1]},
                               f"time per rank, {ctx.which} (click a rank for its steps)", "rank", pick="rank")
    shown = frame.select("rank", *(["stage"] if ctx.has_stages else []), *coords, *parts, "OVERLAP_pct")
    return (ctx.page.chart(bars) + ctx.page.table(_labelled(shown), "each rank's typical step, ms (click a row "
                                                  "for its steps)", pick="rank", filtered_by=("stage",)))


def rank_steps(ctx: Context) -> str:
    """Every rank-step's breakdown, filtered by a picked rank or stage: the drill-down's last level."""
    frame = ctx.traces.read(ctx.run, bd.rank_steps).with_columns(pl.col("pp").alias("stage"))
    shown = frame.select("rank", *(["stage"] if ctx.has_stages else []), "step", *_shown_parts(frame))
    return ctx.page.table(_labelled(shown), "each rank's steps, ms (pick a rank or stage above to filter)",
                          filtered_by=("stage", "rank"))


TIMELINE_RANKS = 128  # lanes drawn at most: more would be under 11 px each; the tables keep every rank
HOST_RANKS = 16  # the timeline draws each rank's host ranges over its lane where it draws at most this many ranks


def _timeline_ranks(ranks: list[int], on_path: set[int]) -> list[int]:
    """The ranks the timeline draws: all up to TIMELINE_RANKS, else every rank on the critical path and evenly
    spaced others up to that count, in their order."""
    if len(ranks) <= TIMELINE_RANKS:
        return ranks
    others = [r for r in ranks if r not in on_path]
    room = max(TIMELINE_RANKS - len(on_path), 0)
    chosen = set(on_path) | set(others[:: max(1, -(-len(others) // room))] if room else [])
    return [r for r in ranks if r in chosen]


def critical_path(ctx: Context) -> str | None:
    """A step's timeline across ranks with the critical path drawn through it, and the path's totals."""
    from traceana.analyses import critical_path as cp
    from traceana.analyses.launches import HOST_LEVELS, LONGEST, host_lanes

    step, windows, intervals, segments = ctx.path
    drawn = _timeline_ranks(windows["rank"].to_list(), set(segments["rank"].to_list()))
    parts = cp.report(segments)
    length_ms = ctx.span_ms
    ranks = f"{windows.height} rank" + ("s" if windows.height > 1 else "")
    if len(drawn) < windows.height:
        ranks += f" ({len(drawn)} drawn: the path's and evenly spaced others)"
    host, launches = (ctx.traces.read(ctx.run, lambda con, rid: host_lanes(con, rid, step, drawn))
                      if len(drawn) <= HOST_RANKS else (None, None))
    chart = charts.timeline(windows.filter(pl.col("rank").is_in(drawn)), intervals.filter(pl.col("rank").is_in(drawn)),
                            segments, f"step {step} across {ranks}, critical path ({length_ms:,.3f} ms) in black; "
                            "wheel to zoom, hover for each interval", host, launches)
    arrows = (f", and a line from the CPU op or NVTX range that launched each of its {LONGEST} longest kernels to "
              "the kernel's start" if launches is not None and launches.height else "")
    said = (f" Above each rank's lane, the top {HOST_LEVELS} levels of its host threads' range trees (CPU ops "
            f"darker; nn.Module, user and NVTX ranges lighter){arrows}: hover for their names; `traceana export "
            "--perfetto` has every range and every launch." if host is not None and host.height else
            f" Host ranges are drawn over the lanes of at most {HOST_RANKS} ranks: `traceana export --perfetto` "
            "has them for every rank." if host is None else "")
    return (f"<p>Step {step}: {length_ms:,.3f} ms from the first rank's start to the last rank's end, "
            f"{segments.height:,} segments on the path.{said}</p>" + ctx.page.chart(chart)
            + ctx.page.table(parts["by_rank"], "the path's time per rank", filtered_by=("stage", "rank"))
            + ctx.page.table(parts["by_kind"], "and per kind")
            + ctx.page.table(cp.hops(parts["segments"]), "hop by hop (consecutive segments on one rank)"))


def communication(ctx: Context) -> str | None:
    """Time per op, dim and link (bars coloured by dim), the table as `traceana comm`, and slow links."""
    frame = ctx.traces.comm(run=ctx.run)
    if frame.is_empty():
        return None
    per = (frame.group_by("dim", "link").agg(pl.col("time_ms").sum(), pl.col("size_bytes").sum())
           .sort("time_ms", descending=True)
           .with_columns(pl.when(pl.col("link").is_null()).then(pl.col("dim"))
                         .otherwise(pl.concat_str("dim", pl.lit(" "), "link")).alias("dim and link")))
    bars = charts.bars(per, "dim and link", "time_ms", [DIM_COLORS.get(d, UNKNOWN_DIM_COLOR) for d in per["dim"]],
                       "communication time per dim and link, summed over ranks and steps", "time (ms)",
                       extra={"bytes": "size_bytes"})
    slow = ctx.traces.slow_links(run=ctx.run)
    return (ctx.page.chart(bars) + ctx.page.table(frame, "per op, dim and link: instances, bytes, time and "
                                                  "bandwidth (algbw, busbw as nccl-tests defines them; GB = 1e9 "
                                                  "bytes), as `traceana comm`")
            + (ctx.page.table(slow, "pairs and groups more than 20% below their peers' median bandwidth")
               if not slow.is_empty() else ""))


def kernels(ctx: Context) -> str | None:
    frame = ctx.traces.kernels(top=50, run=ctx.run)
    if frame.is_empty():
        return None
    return ctx.page.table(frame, "top 50 kernels by total time over all ranks and steps (share of COMP over the "
                                 "same ranks and steps), as `traceana kernels`")


def idle(ctx: Context) -> str | None:
    """IDLE per rank split by cause: stacked bars and the table."""
    from traceana.analyses.idle import CAUSES

    frame = ctx.idle
    if frame.is_empty() or frame["IDLE_ms"].sum() == 0:
        return None
    frame = frame.with_columns(pl.col("pp").alias("stage"))
    causes = {f"{c}_ms": IDLE_CAUSE_COLORS[c] for c in CAUSES if frame[f"{c}_ms"].sum() > 0}
    bars = charts.stacked_bars(frame, "rank", causes, "why each rank was idle, typical step (click a rank for its "
                               "steps)", "rank", pick="rank", y_label="idle time per step (ms)")
    shown = frame.select("rank", *(["stage"] if ctx.has_stages else []), "IDLE_ms", *causes)
    return ctx.page.chart(bars) + ctx.page.table(_labelled(shown), "IDLE per rank in its typical step (mean over "
                                                 "steps after the first), by cause, as `traceana idle`",
                                                 filtered_by=("stage",))


MEMORY_RANKS = 16  # lines drawn at most (evenly spaced ranks); the table keeps every rank


def roofline(ctx: Context) -> str | None:
    """The measured roofline per op shape (`traceana kernels --roofline`): the chart and the table, or why there is
    none (no shapes recorded, not a Kineto trace)."""
    from traceana.analyses.roofline import measure
    from traceana.errors import TraceanaError

    try:
        roof = ctx.traces.read(ctx.run, lambda con, rid: measure(con, rid, "shape", None, None))
    except TraceanaError as exc:
        return f"<p class=note>no roofline: {html.escape(str(exc))}</p>"
    used = set(roof.frame["peak_TFLOP_per_s"].drop_nulls().to_list())
    roofs = {f"{dtype} tensor cores": peak for dtype, peak in roof.peaks.tensor.items()
             if peak in used and dtype in set(roof.frame["dtype"].to_list())}
    if roof.peaks.cuda_core in used:
        roofs["fp32 CUDA cores"] = roof.peaks.cuda_core
    chart = charts.roofline(roof.frame, roofs, roof.peaks.hbm_gb_per_s, f"measured roofline, profile "
                            f"{roof.peaks.profile}: each op shape's achieved TFLOP/s (dot size: its total time)")
    # the table leaves out what the chart and caption already say, so it fits a laptop's width: the raw shapes,
    # the HBM peak and ridge (one per profile), the peak shares (roof_pct is the one of the two that binds)
    shown = roof.frame.drop("input_dims", "peak_GB_per_s", "ridge_FLOP_per_B", "peak_FLOP_pct", "peak_HBM_pct")
    return (ctx.page.chart(chart) + ctx.page.table(shown, "per op, input shapes and kernel: FLOPs and bytes a call "
                                                   "(from the op's shapes), achieved rates, the profile's peak "
                                                   f"(HBM {roof.peaks.hbm_gb_per_s:,.0f} GB/s) and the share of the "
                                                   "roof that binds (`traceana kernels --roofline --json` has "
                                                   "both shares and the ridge)")
            + "".join(f"<p class=note>note: {html.escape(n)}</p>" for n in roof.notes))


QUEUE_STREAMS = 8  # queue lines drawn at most (the deepest streams); the table keeps every stream


def launches(ctx: Context) -> str | None:
    """Launch delay (kernel start − its launch call's start) over time and per kernel, and each stream's queue of
    launched, not yet started work, as `traceana kernels --launch`; None for runs without launch records. As that
    command does, kernel_launches is computed once for the three reads (each a sort of every launched event: at
    1,024 ranks more than a dataset reader's DuckDB may hold) and dropped after."""
    from traceana.analyses.launches import compute_once

    ctx.traces.read(ctx.run, compute_once)
    try:
        return _launch_charts(ctx)
    finally:
        ctx.traces.read(ctx.run, lambda con, _: store.forget(con, "kernel_launches"))


def _launch_charts(ctx: Context) -> str | None:
    per_kernel = ctx.traces.launch_stats(run=ctx.run)
    if per_kernel.is_empty():
        return None
    over_time = ctx.traces.launch_stats(by="time", run=ctx.run).drop_nulls("p50_delay_us")
    per_rank = ctx.traces.launch_stats(by="rank", run=ctx.run)
    delay = charts.lines([(f"{q} launch delay", q, over_time["start_ms"], over_time[f"{q}_delay_us"])
                          for q in ("p50", "p95")], "launch delay over the run (kernel start − its launch call's "
                         "start), per time bucket", "time since the first launch (ms)", "launch delay (µs)")
    queues = ctx.traces.queue_length(run=ctx.run)
    deepest = queues.sort("max_queue", "mean_queue", descending=True).head(QUEUE_STREAMS)
    series = ctx.traces.queue_length(by="time", run=ctx.run).join(deepest.select("rank", "stream"),
                                                                  on=["rank", "stream"])
    queue = charts.lines([(f"rank {r} stream {s}", f"{r}:{s}", part["start_ms"], part["mean_queue"])
                          for (r, s), part in series.group_by(["rank", "stream"], maintain_order=True)],
                         f"queue length over the run: events launched but not started, the {deepest.height} "
                         "deepest streams (mean per time bucket)", "time since the first launch (ms)",
                         "events queued")
    return (ctx.page.chart(delay) + ctx.page.table(per_rank, "per rank: launch delay (µs), launch cost (the median "
                                                   "delay onto an idle device) and the share of kernels shorter "
                                                   "than it", filtered_by=("rank",))
            + ctx.page.table(per_kernel, "per kernel: launch delay (µs) and short_pct (events shorter than their "
                                         "rank's launch cost)")
            + ctx.page.chart(queue) + ctx.page.table(queues, "per rank and stream: queue length (time-weighted "
                                                     "mean, max) and the share of its span with work queued",
                                                     filtered_by=("rank",)))


def memory(ctx: Context) -> str | None:
    """Allocated and reserved memory over time (in a unit for the magnitude), and each rank's largest peak."""
    frame = ctx.traces.memory(run=ctx.run)
    if frame.is_empty():
        return None
    samples = ctx.traces.sql("SELECT rank, ts_ns, allocated_bytes, reserved_bytes FROM memory ORDER BY rank, ts_ns",
                             run=ctx.run)
    origin = samples["ts_ns"].min()
    ranks_all = sorted(set(samples["rank"].to_list()))
    drawn = ranks_all[:: max(1, len(ranks_all) // MEMORY_RANKS)][:MEMORY_RANKS]
    unit, factor, meaning = unit_for(max(frame["peak_allocated_bytes"].max() or 0,
                                         frame["peak_reserved_bytes"].max() or 0), BINARY_BYTES)
    series = []
    for rank in drawn:
        part = samples.filter(pl.col("rank") == rank)
        part = part.gather_every(max(1, part.height // 1000))  # at most ~1000 points per line
        xs = (part["ts_ns"] - origin) / 1e6
        series.append((f"rank {rank} allocated", f"{rank}", xs, part["allocated_bytes"] / factor))
        if part["reserved_bytes"].fill_null(0).max() > 0:
            series.append((f"rank {rank} reserved (dashed)", f"{rank}", xs, part["reserved_bytes"] / factor))
    more = "" if len(drawn) == len(ranks_all) else f" ({len(drawn)} of {len(ranks_all)} ranks drawn)"
    chart = charts.lines(series, f"allocator memory over time{more}; click a legend entry to hide it",
                         "time since the first sample (ms)", f"memory ({unit} = {meaning})")
    peaks = frame.group_by("rank").agg(pl.len().alias("steps"), pl.col("samples").sum(),
                                       *[(pl.col(c).max() / factor).alias(c.replace("_bytes", f"_{unit}"))
                                         for c in ("peak_allocated_bytes", "peak_reserved_bytes")]).sort("rank")
    return ctx.page.chart(chart) + ctx.page.table(peaks, f"largest peak per rank over its steps ({unit} = {meaning}), "
                                                  "as `traceana memory`", filtered_by=("rank",))


def estimate(ctx: Context) -> str | None:
    """The estimate against the measurement per dimension (bars side by side) and per stage."""
    if ctx.estimate is None:
        return None
    from traceana.estimator import config
    from traceana.estimator.estimate import estimate as run_estimate
    from traceana.model.compare import compare_run

    est = run_estimate(config.load(ctx.estimate))
    result = ctx.traces.read(ctx.run, lambda con, rid: compare_run(con, rid, est))
    dims = result.by_dimension.with_columns(pl.col("dim").replace("MP_WAIT", "MP_WAIT (TP)"))
    bars = charts.grouped_bars(dims.rename({"measured_ms": "measured ms", "estimated_ms": "estimated ms"}), "dim",
                               {"measured ms": FIRST_COLOR, "estimated ms": SECOND_COLOR},
                               f"estimate ({ctx.estimate.name}) against measured, ms per step", "dimension",
                               "time per step (ms)")
    parts = [ctx.page.chart(bars), ctx.page.table(dims, f"per dimension: {ctx.estimate.name} vs measured (ms per "
                                                        "step)")]
    if result.by_stage is not None:
        parts.append(ctx.page.table(result.by_stage, "per pipeline stage (ms per step)"))
    if result.memory is not None:
        parts.append(ctx.page.table(result.memory, "peak memory per stage (MiB)"))
    return "".join(parts) + "".join(f"<p class=note>note: {html.escape(n)}</p>" for n in result.notes)


def stragglers(ctx: Context) -> str:
    per_rank = ctx.stragglers.rename({"pp": "stage"})
    stage = per_rank.filter(pl.col("straggler_stage"))
    where = (f"stage {stage['stage'][0]}" if ctx.has_stages else
             "all ranks (one pipeline stage: no pipeline parallelism)" if stage["stage"][0] is not None else
             "all ranks (no pipeline stages: the run has no layout)")
    return (f"<p>Straggler stage (largest mean COMP): {html.escape(where)}, mean COMP "
            f"{stage['COMP_ms'].mean():,.3f} ms per step.</p>"
            + ctx.page.table(per_rank.drop("straggler_stage"), "each rank's COMP against its stage's median (ms, %)",
                             filtered_by=("stage",))
            + ctx.page.table(ctx.traces.late_ranks(run=ctx.run), "ranks the others waited for: last to arrive at "
                                                                 "collectives, by dim"))


# The report after its first screen, in order: (heading, section).
SECTIONS: list[tuple[str, Callable[[Context], str | None]]] = [
    ("Run summary", summary),
    ("Breakdown per pipeline stage", stages),
    ("Breakdown per rank", ranks),
    ("Each rank's steps", rank_steps),
    ("Timeline and critical path", critical_path),
    ("Stragglers", stragglers),
    ("Communication", communication),
    ("Time by op, module and layer", ops_section),
    ("Top kernels", kernels),
    ("Roofline", roofline),
    ("Kernel launches and queues", launches),
    ("Why the device was idle", idle),
    ("Memory", memory),
    ("Estimate vs measured", estimate),
]


def write(traces: Traces, run: str, out: Path, estimate_config: Path | None = None) -> int:
    """Write the report of ``run`` to ``out``; returns its size in bytes."""
    page = Page(f"traceana report: {run}", f"{traces.db}; times in ms per step unless a column says otherwise; "
                                          "MP_WAIT is tensor parallel's exposed wait")
    ctx = Context(traces, run, page, estimate_config)
    with traces.session():  # one connection for the dozens of reads below
        advice = _advice(ctx)
        first = first_screen(ctx, advice)
        page.add("What to change (advise)", advise(ctx, advice))
        for heading, section in SECTIONS:
            page.add(heading, section(ctx))
    return page.write(out, first)
