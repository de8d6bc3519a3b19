"""One self-contained HTML file about a measured run, to send to a colleague: no external URL, no script, plots
inline as base64 PNG.

The report is the list SECTIONS: each entry turns the run (through the Python API, traceana.api.Traces) into a
titled piece of HTML, or None when the run cannot say. A new analysis adds one function and one entry.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from traceana.analyses import breakdown as bd
from traceana.api import Traces
from traceana.errors import TraceanaError
from traceana.model.advise import findings as advise_findings


@dataclass
class Context:
    """What every section may read: the store, the run, where plots are drawn, and an optional job config."""

    traces: Traces
    run: str
    plots: Path
    estimate: Path | None = None


def _table(frame: pl.DataFrame, caption: str | None = None, limit: int = 200) -> str:
    """An HTML table of ``frame`` (numbers right-aligned, floats to 3 decimals); the first ``limit`` rows."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    numeric = [dtype.is_numeric() for dtype in frame.dtypes]
    rows = []
    for row in frame.head(limit).iter_rows():
        cells = "".join(f'<td class="{"n" if is_num else "s"}">{html.escape(_cell(v))}</td>'
                        for v, is_num in zip(row, numeric, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    more = f"<p class=note>first {limit} of {frame.height} rows</p>" if frame.height > limit else ""
    title = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{title}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _image(draw: Callable[[Path], None], ctx: Context, name: str, alt: str) -> str:
    """Draw a PNG with ``draw(path)`` and inline it."""
    path = ctx.plots / f"{name}.png"
    draw(path)
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    """Column names as people read them: MP_WAIT_ms -> MP_WAIT (TP) ms."""
    return frame.rename({c: c.replace("MP_WAIT", bd.label("MP_WAIT")).replace("_ms", " ms").replace("_pct", " %")
                         for c in frame.columns})


def summary(ctx: Context) -> str:
    run = ctx.traces.runs().filter(pl.col("run_id") == ctx.run)
    facts = run.select("run_id", "source_format", "world_size", "layout", "tool_version", "rank_source",
                       pl.col("sources").list.len().alias("sources"), "ingested_at")
    ranks = ctx.traces.breakdown()
    which = ctx.traces.read(ctx.run, lambda con, rid: bd.which_step(con, rid, None))
    parts = ("TOTAL", *[p for p in bd.PARTS if p not in bd.WAITS or ranks[f"{p}_ms"].sum() > 0], "OVERLAPPED")
    means = pl.DataFrame({"part": [bd.label(p) for p in parts],
                          "mean over ranks ms": [ranks[f"{p}_ms"].mean() for p in parts],
                          "max over ranks ms": [ranks[f"{p}_ms"].max() for p in parts]})
    means = means.with_columns((100 * pl.col("mean over ranks ms") / means["mean over ranks ms"][0]).round(1)
                               .alias("% of TOTAL"))
    steps = ctx.traces.steps().group_by("step").agg(pl.len().alias("ranks"),
                                                     ((pl.col("end_ns") - pl.col("start_ns")).mean() / 1e6)
                                                     .alias("mean_ms"), pl.col("from_markers").all()).sort("step")
    notes = run["notes"].to_list()[0] or []
    return (_table(facts) + _table(means, f"where a rank's step went, {which} (OVERLAPPED: communication hidden "
                                          "under compute, not part of TOTAL)")
            + _table(steps, "steps") + "".join(f"<p class=note>note: {html.escape(n)}</p>" for n in notes))


def advise(ctx: Context) -> str | None:
    """The findings `traceana advise` ranks (with the job config, the estimator's too), each with its evidence."""
    found = ctx.traces.advise(run=ctx.run) if ctx.estimate is None else ctx.traces.read(
        ctx.run, lambda con, rid: advise_findings(con, rid, None, str(ctx.estimate))[1])
    if found.is_empty():
        return None
    return _table(found.select("finding", "change", "predicted_step_ms", "gain_ms", "error_bar_ms", "evidence"),
                  f"measured step {found['measured_step_ms'][0]:.3f} ms; each change's predicted step, by gain less "
                  "its error bar (what-if replays of the run's own dependency graph; estimator ratios where the "
                  "graph itself would change)")


def stages(ctx: Context) -> str | None:
    frame = ctx.traces.breakdown(by="stage")
    shown = frame.select("pp", "ranks", *[c for c in frame.columns if c.endswith("_mean_ms")
                                          and (c.removesuffix("_mean_ms") not in bd.WAITS or frame[c].sum() > 0)])
    return _table(_labelled(shown.rename({c: c.replace("_mean_ms", "_ms") for c in shown.columns})),
                  "mean over each stage's ranks, ms per step (pp empty: the run has no layout)")


def ranks(ctx: Context) -> str:
    frame = ctx.traces.breakdown()
    which = ctx.traces.read(ctx.run, lambda con, rid: bd.which_step(con, rid, None))
    from traceana.render.plots import breakdown_bars

    plot = _image(lambda p: breakdown_bars(frame, p, f"{ctx.run}\ntime per rank, {which}"), ctx, "ranks",
                  "stacked bars of each rank's step time")
    shown = frame.select("rank", *[c for c in bd.COORDS if frame[c].n_unique() > 1],
                         *[f"{p}_ms" for p in ("TOTAL", *bd.PARTS, "OVERLAPPED")
                           if p not in bd.WAITS or frame[f"{p}_ms"].sum() > 0])
    return plot + _table(_labelled(shown))


def timeline(ctx: Context) -> str:
    from traceana.render.plots import timeline_gantt

    def frames(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[int, pl.DataFrame, pl.DataFrame]:
        step = bd.first_analysed_step(con, rid)
        return step, *bd.timeline(con, rid, step)

    def draw(path: Path) -> None:
        step, windows, intervals = ctx.traces.read(ctx.run, frames)
        timeline_gantt(windows, intervals, path, f"{ctx.run}: step {step} across {windows.height} ranks")
    return _image(draw, ctx, "timeline", "Gantt chart of the first analysed step across ranks")


def stragglers(ctx: Context) -> str:
    per_rank = ctx.traces.stragglers()
    stage = per_rank.filter(pl.col("straggler_stage"))
    where = f"stage {stage['pp'][0]}" if stage["pp"][0] is not None else "all ranks (no pipeline stages)"
    return (f"<p>Straggler stage (largest mean COMP): {html.escape(where)}, mean COMP "
            f"{stage['COMP_ms'].mean():,.3f} ms per step.</p>"
            + _table(per_rank.drop("straggler_stage"), "each rank's COMP against its stage's median (ms, %)")
            + _table(ctx.traces.late_ranks(), "ranks the others waited for: last to arrive at collectives, by dim"))


def critical_path(ctx: Context) -> str | None:
    """The path's totals by rank and kind (as `traceana critical-path`) and the step's timeline with it drawn."""
    from traceana.analyses import critical_path as cp
    from traceana.render.plots import timeline_gantt

    def frames(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[int, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        step, windows, segments = cp.of_step(con, rid, None)
        return step, windows, bd.timeline(con, rid, step)[1], segments

    step, windows, intervals, segments = ctx.traces.read(ctx.run, frames)
    parts = cp.report(segments)
    length_ms = (segments["end_ns"].max() - segments["start_ns"].min()) / 1e6
    plot = _image(lambda p: timeline_gantt(windows, intervals, p, f"{ctx.run}: step {step}, critical path "
                                           f"({length_ms:,.3f} ms) in red", critical=segments),
                  ctx, "critical_path", "the step's timeline across ranks with the critical path drawn over it")
    return (f"<p>Step {step}: {length_ms:,.3f} ms from the first rank's start to the last rank's end, "
            f"{segments.height} segments on the path.</p>" + plot
            + _table(parts["by_rank"], "the path's time per rank") + _table(parts["by_kind"], "and per kind")
            + _table(cp.hops(parts["segments"]), "hop by hop (consecutive segments on one rank)", limit=40))


def communication(ctx: Context) -> str | None:
    frame = ctx.traces.comm()
    if frame.is_empty():
        return None
    slow = ctx.traces.slow_links()
    return (_table(frame, "per op, dim and link: instances, bytes, time and bandwidth (algbw, busbw as nccl-tests "
                          "defines them; GB = 1e9 bytes), as `traceana comm`")
            + (_table(slow, "pairs and groups more than 20% below their peers' median bandwidth")
               if not slow.is_empty() else ""))


def kernels(ctx: Context) -> str | None:
    frame = ctx.traces.kernels(top=15)
    if frame.is_empty():
        return None
    return _table(frame, "top 15 kernels by total time over all ranks and steps (share of COMP over the same ranks "
                         "and steps), as `traceana kernels`")


def idle(ctx: Context) -> str | None:
    from traceana.analyses.idle import CAUSES

    frame = ctx.traces.idle()
    if frame.is_empty() or frame["IDLE_ms"].sum() == 0:
        return None
    shown = frame.select("rank", "pp", "IDLE_ms", *[f"{c}_ms" for c in CAUSES if frame[f"{c}_ms"].sum() > 0])
    return _table(_labelled(shown), "IDLE per rank in its typical step (mean over steps after the first), by cause, "
                                    "as `traceana idle`")


def memory(ctx: Context) -> str | None:
    frame = ctx.traces.memory()
    if frame.is_empty():
        return None
    mib = [(pl.col(c).max() / 2**20).alias(c.replace("_bytes", " MiB")) for c in ("peak_allocated_bytes",
                                                                                 "peak_reserved_bytes")]
    return _table(frame.group_by("rank").agg(pl.len().alias("steps"), pl.col("samples").sum(), *mib).sort("rank"),
                  "largest peak per rank over its steps (MiB = 2^20 bytes), as `traceana memory`")


def estimate(ctx: Context) -> str | None:
    if ctx.estimate is None:
        return None
    from traceana.estimator import config
    from traceana.estimator.estimate import estimate as run_estimate
    from traceana.model.compare import compare_run
    from traceana.render.compare_plot import run_scatter

    est = run_estimate(config.load(ctx.estimate))
    result = ctx.traces.read(ctx.run, lambda con, rid: compare_run(con, rid, est))
    plot = _image(lambda p: run_scatter(result, p, f"{ctx.run}: estimate ({ctx.estimate.name}) vs measured"),
                  ctx, "estimate", "estimated against measured per dimension and stage")
    parts = [plot, _table(_labelled(result.by_dimension.with_columns(pl.col("dim").replace("MP_WAIT", "MP_WAIT (TP)"))),
                          f"per dimension: {ctx.estimate.name} vs measured (ms per step)")]
    if result.by_stage is not None:
        parts.append(_table(result.by_stage, "per pipeline stage (ms per step)"))
    if result.memory is not None:
        parts.append(_table(result.memory, "peak memory per stage (MiB)"))
    return "".join(parts) + "".join(f"<p class=note>note: {html.escape(n)}</p>" for n in result.notes)


# The report, in order: (heading, section). A section returns None when it has nothing to say about this run.
SECTIONS: list[tuple[str, Callable[[Context], str | None]]] = [
    ("Run summary", summary),
    ("What to change (advise)", advise),
    ("Breakdown per pipeline stage", stages),
    ("Breakdown per rank", ranks),
    ("Timeline of the first analysed step", timeline),
    ("Stragglers", stragglers),
    ("Critical path", critical_path),
    ("Communication", communication),
    ("Top kernels", kernels),
    ("Why the device was idle", idle),
    ("Memory", memory),
    ("Estimate vs measured", estimate),
]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 1400px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.85em; }
caption { text-align: left; font-style: italic; padding: 0.3em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; } th { background: #f3f3f3; }
td.n { text-align: right; font-variant-numeric: tabular-nums; } img { max-width: 100%; }
.note { color: #666; font-size: 0.85em; }
"""


def render(traces: Traces, run: str, estimate_config: Path | None = None) -> str:
    """The whole report as one HTML document."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Context(traces, run, Path(tmp), estimate_config)
        parts = []
        for heading, section in SECTIONS:
            body = section(ctx)
            if body is not None:
                parts.append(f"<section><h2>{html.escape(heading)}</h2>{body}</section>")
    made = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>traceana: {html.escape(run)}</title>'
            f"<style>{STYLE}</style></head><body><h1>traceana report: {html.escape(run)}</h1>"
            f"<p class=note>{html.escape(str(traces.db))}, written {made}. Times in ms per step unless a column "
            f"says otherwise; MP_WAIT is tensor parallel's exposed wait.</p>{''.join(parts)}</body></html>\n")


def write(traces: Traces, run: str, out: Path, estimate_config: Path | None = None) -> None:
    text = render(traces, run, estimate_config)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise TraceanaError(f"{out}: cannot write ({exc.strerror})") from None
