"""The report's charts, as Bokeh figures: hover shows each bar's value, the wheel zooms, and bars that stand for a
stage or a rank pick it (page.py's drill-down). Colours are the static plots' (render/plots.py): one per dim
everywhere. Timelines are decimated (intervals closer than a pixel merged) so a 256-rank step stays light; tables
keep every number."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
from bokeh.models import ColumnDataSource, CustomJS, HoverTool, Legend
from bokeh.plotting import figure

from traceana.analyses.breakdown import label
from traceana.render.colours import (
    COMP_COLOR,
    CRITICAL_PATH_COLOR,
    DIM_COLORS,
    FAMILY_COLORS,
    HOST_COLORS,
    LAUNCH_COLOR,
    OTHER_FAMILY_COLOR,
    PART_COLORS,
)

TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
TIMELINE_PIXELS = 2000  # intervals closer than the step's length / this are drawn as one
HOST_BAND = 0.8  # a rank's host band over its lane (height 1), when the timeline draws host ranges


def _compact(columns: dict[str, pl.Series]) -> dict[str, object]:
    """Columns for a data source: numbers as float32 arrays (Bokeh sends them base64-encoded, a quarter of their
    JSON text; 60 ns at 1 s is finer than a pixel), other columns as lists."""
    return {name: series.cast(pl.Float32).to_numpy() if series.dtype.is_numeric() else series.to_list()
            for name, series in columns.items()}


def _pickable(source: ColumnDataSource, key: str) -> None:
    """Tapping a bar of ``source`` picks its ``key``; a tap on nothing drops that pick."""
    source.name = f"pick:{key}"
    source.selected.js_on_change("indices", CustomJS(args={"source": source, "key": key}, code="""
        if (traceana.picking) return;
        const i = source.selected.indices;
        if (i.length === 1) traceana.pick(key, String(source.data[key][i[0]]));
        else if (i.length === 0) traceana.pick(key, null);"""))


def stacked_bars(frame: pl.DataFrame, x: str, parts: dict[str, str], title: str, x_label: str,
                 pick: str | None = None, y_label: str = "time per step (ms)") -> figure:
    """One stacked bar per row of ``frame`` (``parts``: column -> colour, e.g. COMP_ms -> grey); hover names the
    bar, the part and its value; a part zero everywhere is left out."""
    parts = {c: color for c, color in parts.items() if frame[c].abs().sum() > 0 or c in ("COMP_ms",)}
    factors = [str(v) for v in frame[x].to_list()]
    data = {c: frame[c].to_list() for c in frame.columns if c != x} | {x: factors}
    if pick and pick != x and pick in frame.columns:
        data[pick] = [None if v is None else str(v) for v in frame[pick].to_list()]
    source = ColumnDataSource(data)
    if pick:
        _pickable(source, pick)
    fig = figure(x_range=factors, height=360, title=title, tools=TOOLS + (",tap" if pick else ""),
                 toolbar_location="above", sizing_mode="stretch_width")
    names = list(parts)
    renderers = fig.vbar_stack(names, x=x, width=0.75 if len(factors) > 2 else 0.3, source=source,
                               color=[c for c in parts.values()],
                               line_color="#555555", line_width=0.3, nonselection_fill_alpha=0.25)
    legend = Legend(items=[(_legend(c), [r]) for c, r in zip(names, renderers, strict=True)], location="top_left")
    fig.add_layout(legend, "right")
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[(x_label, f"@{{{x}}}"), ("part", "$name"),
                                                           ("value", "@$name{0,0.000}")]))
    fig.xaxis.axis_label = x_label
    fig.yaxis.axis_label = y_label
    fig.xaxis.major_label_orientation = 0.8 if len(factors) > 32 else 0
    fig.xgrid.grid_line_color = None
    fig.y_range.start = 0
    return fig


def parts_bar(values: dict[str, float], colors: dict[str, str], title: str) -> figure:
    """One horizontal bar split into ``values`` (part label -> ms), for the first screen."""
    source = ColumnDataSource({name: [v] for name, v in values.items()} | {"y": ["step"]})
    fig = figure(y_range=["step"], height=150, title=title, tools="save", toolbar_location=None,
                 sizing_mode="stretch_width")
    drawn = fig.hbar_stack(list(values), y="y", height=0.7, source=source, color=[colors[n] for n in values],
                           line_color="#555555", line_width=0.3)
    fig.add_layout(Legend(items=[(n, [r]) for n, r in zip(values, drawn, strict=True)], orientation="horizontal"),
                   "below")
    fig.add_tools(HoverTool(renderers=drawn, tooltips=[("part", "$name"), ("ms per step", "@$name{0,0.000}")]))
    fig.xaxis.axis_label = "ms per step"
    fig.yaxis.visible = False
    fig.x_range.start = 0
    return fig


def gains(frame: pl.DataFrame, title: str) -> figure:
    """One horizontal bar per finding (``frame``: finding, change, gain_ms, gain_low_ms, gain_high_ms, interval):
    its predicted gain, the interval drawn over it as a line with caps of a fixed pixel size, so that one of a few
    µs still shows, and its numbers (``interval``) written beside it."""
    factors = [f"{i}. {name}" for i, name in enumerate(frame["finding"], 1)]
    source = ColumnDataSource({"y": factors, **{c: frame[c].to_list() for c in frame.columns}})
    low, high = min(0.0, frame["gain_low_ms"].min()), max(0.0, frame["gain_high_ms"].max())
    fig = figure(y_range=factors[::-1], height=70 + 30 * len(factors), title=title, tools="save",
                 toolbar_location=None, sizing_mode="stretch_width")
    bars = fig.hbar(y="y", left=0, right="gain_ms", height=0.6, source=source, color=COMP_COLOR, alpha=0.5)
    fig.segment(x0="gain_low_ms", x1="gain_high_ms", y0="y", y1="y", source=source, line_color="black",
                line_width=2)
    for end in ("gain_low_ms", "gain_high_ms"):
        fig.scatter(x=end, y="y", source=source, marker="dash", angle=1.5708, size=14, line_color="black",
                    line_width=2)
    fig.text(x="gain_high_ms", y="y", text="interval", source=source, x_offset=10, text_baseline="middle",
             text_font_size="11px")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("finding", "@finding"), ("change", "@change"),
                                                        ("gain (ms)", "@interval")]))
    fig.x_range.start = low
    fig.x_range.end = high + 0.45 * ((high - low) or 1.0)  # room for the numbers
    fig.xaxis.axis_label = "gain: measured − predicted step (ms)"
    fig.ygrid.grid_line_color = None
    return fig


def _legend(column: str) -> str:
    part = column.removesuffix("_ms")
    return f"{label(part)} ms"


def grouped_bars(frame: pl.DataFrame, x: str, series: dict[str, str], title: str, x_label: str,
                 y_label: str) -> figure:
    """Bars of several columns side by side per row (``series``: column -> colour), e.g. measured beside estimated."""
    from bokeh.transform import dodge

    factors = [str(v) for v in frame[x].to_list()]
    source = ColumnDataSource({c: frame[c].to_list() for c in series} | {x: factors})
    fig = figure(x_range=factors, height=340, title=title, tools=TOOLS, toolbar_location="above",
                 sizing_mode="stretch_width")
    width = 0.8 / len(series)
    for i, (column, color) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        bars = fig.vbar(x=dodge(x, offset, range=fig.x_range), top=column, width=width * 0.95, source=source,
                        color=color, legend_label=column)
        fig.add_tools(HoverTool(renderers=[bars], tooltips=[(x_label, f"@{{{x}}}"),
                                                            (column, f"@{{{column}}}{{0,0.000}}")]))
    fig.xaxis.axis_label = x_label
    fig.yaxis.axis_label = y_label
    fig.xgrid.grid_line_color = None
    fig.legend.location = "top_left"
    fig.add_layout(fig.legend[0], "right")
    return fig


def bars(frame: pl.DataFrame, x: str, value: str, colors: list[str], title: str, y_label: str,
         extra: dict[str, str] | None = None) -> figure:
    """One bar per row of ``frame``, each in its own colour (a dim's), hover showing the value and ``extra``
    (label -> column)."""
    factors = [str(v) for v in frame[x].to_list()]
    extra = extra or {}
    source = ColumnDataSource({x: factors, value: frame[value].to_list(), "color": [c for c in colors]}
                              | {c: frame[c].to_list() for c in extra.values()})
    fig = figure(x_range=factors, height=320, title=title, tools=TOOLS, toolbar_location="above",
                 sizing_mode="stretch_width")
    drawn = fig.vbar(x=x, top=value, width=0.75, source=source, color="color")
    fig.add_tools(HoverTool(renderers=[drawn], tooltips=[(x, f"@{{{x}}}"), (y_label, f"@{{{value}}}{{0,0.000}}")]
                            + [(name, f"@{{{c}}}{{0,0}}") for name, c in extra.items()]))
    fig.xaxis.axis_label = x
    fig.yaxis.axis_label = y_label
    fig.xgrid.grid_line_color = None
    if frame[value].min() >= 0:
        fig.y_range.start = 0
    return fig


def decimate(intervals: pl.DataFrame, tolerance_ns: int, first: Sequence[str] = ()) -> pl.DataFrame:
    """Per rank and lane, intervals less than ``tolerance_ns`` apart merged into one (``merged``: how many; the
    ``first`` columns: the first interval's, of those starting together the shortest, then by those columns), in
    that order: the page is the same from run to run (ties in the store's order chose 'detach' or 'aten::detach')."""
    return (intervals.sort("rank", "lane", "start_ns", "end_ns", *first)
            .with_columns(pl.col("end_ns").cum_max().shift(1).over("rank", "lane").alias("reach"))
            .with_columns(((pl.col("start_ns") - pl.col("reach")) > tolerance_ns).fill_null(True)
                          .cum_sum().over("rank", "lane").alias("piece"))
            .group_by("rank", "lane", "piece", maintain_order=True)
            .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.len().alias("merged"),
                 *(pl.col(c).first() for c in first))
            .drop("piece"))


def timeline(windows: pl.DataFrame, intervals: pl.DataFrame, path: pl.DataFrame | None, title: str,
             host: pl.DataFrame | None = None, launches: pl.DataFrame | None = None) -> figure:
    """One lane per rank over one step: COMP in grey on top, each dim's communication in its colour below, the
    rank's step window outlined, the critical path (``path``: rank, kind, start_ns, end_ns) drawn through it. With
    ``host`` (analyses/launches.py host_lanes: rank, depth, start_ns, end_ns, name, kind ...) a band above a rank's
    lane holds the top levels of its host threads' range trees, and ``launches`` (rank, launch_ns, start_ns, end_ns,
    kernel, op, depth) are lines from the launching op or NVTX range down to the kernel's start."""
    origin = windows["start_ns"].min()
    span = max(int(windows["end_ns"].max() - origin), 1)
    band = HOST_BAND if host is not None and host.height else 0.0
    lanes = {rank: i * (1 + band) + band for i, rank in enumerate(windows["rank"].to_list())}  # a device lane's top
    dims = [d for d in DIM_COLORS if d in set(intervals["lane"].to_list())]
    height = 0.45 / max(len(dims), 1)
    spans = {"COMP": (0.05, 0.4)} | {d: (0.5 + i * height, height) for i, d in enumerate(dims)}
    drawn = decimate(intervals, span // TIMELINE_PIXELS)
    fig = figure(height=min(max(260, (60 if band else 22) * len(lanes) + 120), 1400), title=title,
                 sizing_mode="stretch_width", tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="above",
                 y_range=(len(lanes) * (1 + band), 0), x_range=(0, span / 1e6))
    fig.quad(left=[(s - origin) / 1e6 for s in windows["start_ns"]], right=[(e - origin) / 1e6 for e in
                                                                            windows["end_ns"]],
             top=[lanes[r] + 0.02 for r in windows["rank"]], bottom=[lanes[r] + 0.98 for r in windows["rank"]],
             fill_color=None, line_color="#bbbbbb", legend_label="the rank's step window (blank inside: idle)")
    for lane in ("COMP", *dims):
        part = drawn.filter(pl.col("lane") == lane)
        offset, size = spans[lane]
        y = part["rank"].replace_strict(lanes, return_dtype=pl.Float64)
        source = ColumnDataSource(_compact({
            "left": (part["start_ns"] - origin) / 1e6, "right": (part["end_ns"] - origin) / 1e6,
            "top": y + offset, "bottom": y + offset + size, "rank": part["rank"],
            "ms": (part["end_ns"] - part["start_ns"]) / 1e6, "merged": part["merged"]}))
        color = COMP_COLOR if lane == "COMP" else DIM_COLORS[lane]
        quads = fig.quad(left="left", right="right", top="top", bottom="bottom", source=source,
                         color=color, line_width=0,
                         legend_label="COMP (compute, memcpy, memset)" if lane == "COMP" else f"{lane} communication")
        fig.add_tools(HoverTool(renderers=[quads], tooltips=[("rank", "@rank"), ("lane", lane),
                                                             ("start (ms)", "@left{0,0.000}"),
                                                             ("length (ms)", "@ms{0,0.000}"),
                                                             ("intervals merged", "@merged")]))
    if band:
        _draw_host(fig, host, launches, lanes, origin, span // TIMELINE_PIXELS)
    if path is not None and path.height:
        _draw_path(fig, path, lanes, origin)
    fig.yaxis.ticker = [y + 0.5 for y in list(lanes.values())[:: max(1, len(lanes) // 48)]]
    fig.yaxis.major_label_overrides = {y + 0.5: f"rank {r}" for r, y in lanes.items()}
    fig.xaxis.axis_label = "time since the step's first start (ms)"
    fig.yaxis.axis_label = "rank" + (" (above each: its host threads' ranges)" if band else "")
    fig.add_layout(fig.legend[0], "right")
    return fig


def _draw_host(fig: figure, host: pl.DataFrame, launches: pl.DataFrame | None, lanes: dict[int, float], origin: int,
               tolerance_ns: int) -> None:
    """Above each rank's lane, a row per level of its host threads' range trees (CPU ops darker than the other
    ranges), ranges closer than a pixel merged; and a line from each traced kernel's launch in its op or NVTX range
    down to the kernel's start."""
    levels = int(host["depth"].max())
    row = (HOST_BAND - 0.1) / levels
    drawn = decimate(host.rename({"depth": "lane"}), tolerance_ns, ("name", "kind", "thread")).rename({"lane": "depth"})
    y = drawn["rank"].replace_strict(lanes, return_dtype=pl.Float64) - HOST_BAND + 0.05 + (drawn["depth"] - 1) * row
    source = ColumnDataSource(_compact({
        "left": (drawn["start_ns"] - origin) / 1e6, "right": (drawn["end_ns"] - origin) / 1e6, "top": y,
        "bottom": y + row * 0.9, "rank": drawn["rank"], "depth": drawn["depth"], "thread": drawn["thread"],
        "ms": (drawn["end_ns"] - drawn["start_ns"]) / 1e6, "merged": drawn["merged"], "name": drawn["name"]})
        | {"color": [HOST_COLORS.get(k, HOST_COLORS["range"]) for k in drawn["kind"]]})
    quads = fig.quad(left="left", right="right", top="top", bottom="bottom", source=source, color="color",
                     line_width=0, legend_label="host: CPU ops (darker), module, user and NVTX ranges")
    fig.add_tools(HoverTool(renderers=[quads], tooltips=[
        ("", "@name"), ("rank, thread", "@rank, @thread"), ("level", "@depth"), ("start (ms)", "@left{0,0.000}"),
        ("length (ms)", "@ms{0,0.000}"), ("ranges merged", "@merged (the first named)")]))
    if launches is None or not launches.height:
        return
    top = launches["rank"].replace_strict(lanes, return_dtype=pl.Float64)
    source = ColumnDataSource(_compact({
        "x0": (launches["launch_ns"] - origin) / 1e6, "x1": (launches["start_ns"] - origin) / 1e6,
        "y0": top - HOST_BAND + 0.05 + (launches["depth"].clip(upper_bound=levels) - 0.5) * row, "y1": top + 0.05,
        "rank": launches["rank"], "ms": (launches["end_ns"] - launches["start_ns"]) / 1e6,
        "kernel": launches["kernel"], "op": launches["op"]}))
    lines = fig.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=source, line_color=LAUNCH_COLOR, line_width=1.2,
                        legend_label="launch of a rank's longest kernels, from its CPU op or NVTX range")
    fig.add_tools(HoverTool(renderers=[lines], tooltips=[("kernel", "@kernel"), ("launched by", "@op"),
                                                         ("rank", "@rank"), ("kernel (ms)", "@ms{0,0.000}")]))


def _draw_path(fig: figure, path: pl.DataFrame, rows: dict[int, float], origin: int) -> None:
    """The path through its lanes' middle: bold over work and communication, thin over idle, vertical at jumps.
    Consecutive segments of one kind on one rank are drawn as one."""
    runs = (path.with_columns(((pl.col("rank") != pl.col("rank").shift(1)) | (pl.col("kind") != pl.col("kind")
                                                                              .shift(1))).fill_null(True)
                              .cum_sum().alias("piece"))
            .group_by("piece", maintain_order=True)
            .agg(pl.col("rank").first(), pl.col("kind").first(), pl.col("start_ns").min(), pl.col("end_ns").max(),
                 pl.len().alias("segments")))
    segs = runs.select("rank", "kind", "segments",
                       (pl.col("rank").replace_strict(rows, return_dtype=pl.Float64) + 0.5).alias("y"),
                       ((pl.col("start_ns") - origin) / 1e6).alias("x0"),
                       ((pl.col("end_ns") - origin) / 1e6).alias("x1"))
    jumps = segs.with_columns(pl.col("y").shift(1).alias("y0")).filter(pl.col("y0") != pl.col("y"))
    color = CRITICAL_PATH_COLOR
    fig.segment(x0="x0", x1="x0", y0="y0", y1="y", line_color=color, line_width=1.2,
                source=ColumnDataSource(_compact({c: jumps[c] for c in ("x0", "y0", "y")})))
    for idle, width, alpha in ((False, 3, 1.0), (True, 1.5, 0.5)):
        part = segs.filter((pl.col("kind") == "idle") == idle)
        source = ColumnDataSource(_compact({c: part[c] for c in part.columns} | {"ms": part["x1"] - part["x0"]}))
        drawn = fig.segment(x0="x0", x1="x1", y0="y", y1="y", source=source, line_color=color, line_width=width,
                            line_alpha=alpha, legend_label="critical path" + (" (idle on it)" if idle else ""))
        fig.add_tools(HoverTool(renderers=[drawn], tooltips=[("critical path", "@kind on rank @rank"),
                                                             ("length (ms)", "@ms{0,0.000}"),
                                                             ("segments", "@segments")]))


def roofline(frame: pl.DataFrame, roofs: dict[str, float], hbm_gb_per_s: float, title: str) -> figure:
    """Log-log roofline: each op shape at its intensity (FLOP/B) and achieved TFLOP/s, sized by its total time and
    coloured by op family, under the roofs min(peak, intensity x HBM) of ``roofs`` (label -> peak TFLOP/s)."""
    import math

    fig = figure(height=460, title=title, tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above",
                 sizing_mode="stretch_width", x_axis_type="log", y_axis_type="log")
    low = max(min(frame["FLOP_per_B"].min(), 0.05), 1e-3)
    high = max(frame["FLOP_per_B"].max() * 4, 1e3)
    for name, peak in roofs.items():
        ridge = peak * 1e3 / hbm_gb_per_s
        fig.line([low, ridge, high], [low * hbm_gb_per_s / 1e3, peak, peak], line_color="#333333",
                 line_dash="dashed" if "CUDA" in name else "solid", legend_label=f"roof: {name}")
    largest = frame["total_ms"].max() or 1.0
    for family, part in frame.group_by("family", maintain_order=True):
        source = ColumnDataSource(_compact({c: part[c] for c in ("FLOP_per_B", "TFLOP_per_s", "GB_per_s",
                                                                  "roof_pct", "total_ms", "calls", "op",
                                                                  "shapes", "kernel")})
                                  | {"size": [6 + 24 * math.sqrt(t / largest) for t in part["total_ms"]]})
        dots = fig.scatter("FLOP_per_B", "TFLOP_per_s", size="size", source=source, fill_alpha=0.6,
                           color=FAMILY_COLORS.get(family[0], OTHER_FAMILY_COLOR), legend_label=family[0])
        fig.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("op", "@op"), ("shapes", "@shapes"), ("kernel", "@kernel"), ("achieved", "@TFLOP_per_s{0,0.0} TFLOP/s, "
                                                                              "@GB_per_s{0,0} GB/s"),
            ("intensity", "@FLOP_per_B{0,0.00} FLOP/B"), ("of the roof", "@roof_pct{0.0}%"),
            ("time", "@total_ms{0,0.000} ms over @calls calls")]))
    fig.xaxis.axis_label = "arithmetic intensity (FLOP per byte moved)"
    fig.yaxis.axis_label = "achieved TFLOP/s"
    fig.legend.click_policy = "hide"
    fig.add_layout(fig.legend[0], "right")
    return fig


def lines(series: Sequence[tuple[str, str, pl.Series, pl.Series]], title: str, x_label: str,
          y_label: str) -> figure:
    """Step lines (a level held until the next sample), one per (name, group, x, y): one colour per group, the
    second line of a group dashed; click a legend entry to hide the line."""
    from bokeh.palettes import Category20_20

    fig = figure(height=360, title=title, tools=TOOLS, toolbar_location="above", sizing_mode="stretch_width")
    groups: dict[str, int] = {}
    for name, group, xs, ys in series:
        dashed = group in groups
        color = Category20_20[groups.setdefault(group, len(groups)) % 20]
        drawn = fig.step("x", "y", source=ColumnDataSource(_compact({"x": xs, "y": ys})), mode="after",
                         line_color=color, legend_label=name, line_dash="dashed" if dashed else "solid")
        fig.add_tools(HoverTool(renderers=[drawn], tooltips=[("", name), ("x", "$x{0,0.000}"), ("y", "$y{0,0.000}")],
                                mode="vline"))
    fig.xaxis.axis_label = x_label
    fig.yaxis.axis_label = y_label
    fig.legend.click_policy = "hide"
    fig.add_layout(fig.legend[0], "right")
    return fig


# a breakdown column -> its part's colour (COMP_ms -> grey, MP_WAIT_ms -> TP's blue, ...)
PART_COLUMNS = {f"{p}_ms": c for p, c in PART_COLORS.items()}
