"""The pictures: stacked bars per rank grouped by pipeline stage, a Gantt of one step, the communication heatmaps,
memory over time, what-if bars, and the roofline of measured kernels."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

from traceana.analyses.breakdown import label
from traceana.analyses.diff import occurring
from traceana.errors import TraceanaError
from traceana.render.colours import COMP_COLOR, CRITICAL_PATH_COLOR, DIM_COLORS, FAMILY_COLORS, PART_COLORS
from traceana.render.units import BANDWIDTH, BINARY_BYTES, unit_for

if TYPE_CHECKING:
    from traceana.model.intervals import Interval


def save_figure(fig: Figure, path: Path, dpi: int) -> None:
    """Write ``fig`` to ``path`` and close it, cropped to what it draws (an axis label or legend that the layout
    pushed past the canvas is kept, not clipped); a write the file system refuses is one line naming the file."""
    try:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    except OSError as exc:
        raise TraceanaError(f"--plot {path}: cannot write the plot ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def pipelined(stages: list[int | None]) -> bool:
    """Whether ranks have more than one pipeline stage: only then do plots group or label ranks by stage (a run
    without pipeline parallelism is all stage 0, or has no stages without a layout)."""
    return len({s for s in stages if s is not None}) > 1


def _bar_limits(ax: plt.Axes, xs: list[float]) -> None:
    """Room for at least six bars, so that one or two ranks are bars, not walls."""
    pad = max(0.6, (6 - (max(xs) - min(xs))) / 2) if xs else 0.6
    ax.set_xlim(min(xs, default=0) - pad, max(xs, default=0) + pad)


def _stage_positions(stages: list[int | None]) -> tuple[list[float], list[tuple[float, str]]]:
    """x of each rank (ranks already sorted by stage) with a one-bar gap between stages, and stage label points;
    one bar after the other and no labels when the run has no pipeline stages."""
    if not pipelined(stages):
        return [float(i) for i in range(len(stages))], []
    xs: list[float] = []
    labels: list[tuple[float, str]] = []
    x, first = 0.0, 0
    for i, stage in enumerate(stages):
        if i and stage != stages[i - 1]:
            labels.append(((xs[first] + xs[-1]) / 2, f"stage {stages[i - 1]}"))
            x, first = x + 1, i
        xs.append(x)
        x += 1
    if stages:
        labels.append(((xs[first] + xs[-1]) / 2, f"stage {stages[-1]}" if stages[-1] is not None else "no stage"))
    return xs, labels


def breakdown_bars(frame: pl.DataFrame, path: Path, title: str, stack: dict[str, str] = PART_COLORS,
                   ylabel: str = "time per step (ms)") -> None:
    """One stacked bar per rank (``stack``: part -> color, read from ``<part>_ms``; by default COMP, each *_WAIT,
    IDLE), ranks grouped by stage; a part zero on every rank is left out, except COMP and IDLE; OVERLAPPED beside."""
    frame = frame.sort(pl.col("pp").fill_null(-1), "rank")
    xs, stage_labels = _stage_positions(frame["pp"].to_list())
    fig, ax = plt.subplots(figsize=(max(9.0, min(0.35 * len(xs) + 5, 40.0)), 5))
    bottom = [0.0] * len(xs)
    for part, color in stack.items():
        values = frame[f"{part}_ms"].to_list()
        if part not in ("COMP", "IDLE") and not any(values):
            continue
        ax.bar(xs, values, bottom=bottom, width=0.7, color=color, edgecolor="0.3", linewidth=0.3,
               label=f"{label(part)} ms")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if "OVERLAPPED_ms" in frame.columns and frame["OVERLAPPED_ms"].sum() > 0:
        ax.bar([x + 0.42 for x in xs], frame["OVERLAPPED_ms"].to_list(), width=0.12, color="black",
               label="OVERLAPPED ms (comm hidden under COMP, not in TOTAL)")
    ticks = xs if len(xs) <= 64 else xs[:: len(xs) // 32]
    ranks = frame["rank"].to_list()
    ax.set_xticks(ticks, [str(ranks[xs.index(t)]) for t in ticks], fontsize=7)
    _bar_limits(ax, xs)
    for x, text in stage_labels:
        ax.annotate(text, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -28), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xlabel("rank (grouped by pipeline stage)" if stage_labels else "rank", labelpad=18 if stage_labels else 4)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def timeline_gantt(windows: pl.DataFrame, intervals: pl.DataFrame, path: Path, title: str,
                   critical: pl.DataFrame | None = None) -> None:
    """One lane per rank over one step: COMP in grey on top, each dim's communication in its color below, idle blank.

    ``windows``: rank, pp, start_ns, end_ns (lane order); ``intervals``: rank, lane, start_ns, end_ns;
    ``critical``: the critical path's segments (rank, kind, start_ns, end_ns), drawn as a black line through the lanes.
    """
    origin = windows["start_ns"].min()
    dims = [d for d in DIM_COLORS if d in set(intervals["lane"].to_list())]
    rows = {rank: i for i, rank in enumerate(windows["rank"].to_list())}
    fig, ax = plt.subplots(figsize=(12, min(max(3.0, 0.45 * len(rows) + 1.5), 30.0)))
    band = 0.45 / max(len(dims), 1)  # the lower half of a lane is shared by the dims that communicate in this step
    spans = {"COMP": (0.05, 0.4)} | {d: (0.5 + i * band, band) for i, d in enumerate(dims)}  # y grows downwards
    for (lane,), group in intervals.with_columns(
            ((pl.col("start_ns") - origin) / 1e6).alias("x"), ((pl.col("end_ns") - pl.col("start_ns")) / 1e6)
            .alias("w")).group_by(["lane"]):
        offset, height = spans[lane]
        color = COMP_COLOR if lane == "COMP" else DIM_COLORS[lane]
        for rank, part in group.group_by("rank"):
            y = rows[rank[0]]
            ax.broken_barh(list(zip(part["x"].to_list(), part["w"].to_list(), strict=True)),
                           (y + offset, height), facecolors=color, linewidth=0)
    for rank, y in rows.items():
        w = windows.filter(pl.col("rank") == rank)
        ax.add_patch(plt.Rectangle(((w["start_ns"][0] - origin) / 1e6, y + 0.02), (w["end_ns"][0] - w["start_ns"][0])
                                   / 1e6, 0.96, fill=False, edgecolor="0.75", linewidth=0.5))
    if critical is not None:
        _draw_path(ax, critical, rows, origin)
    staged = pipelined(windows["pp"].to_list())
    labels = [f"rank {r}" + (f" (stage {s})" if staged and s is not None else "")
              for r, s in zip(rows, windows["pp"].to_list(), strict=True)]
    every = max(1, len(rows) // 64)  # at most 64 labels
    ax.set_yticks([y + 0.5 for y in list(rows.values())[::every]], labels[::every], fontsize=7)
    ax.set_ylim(0, len(rows))
    ax.invert_yaxis()
    ax.set_xlim(0, (windows["end_ns"].max() - origin) / 1e6)
    ax.set_xlabel("time since the step's first start (ms)")
    ax.set_ylabel("rank")
    ax.set_title(title)
    handles = [Patch(color=COMP_COLOR, label="COMP (compute / memcpy / memset)")]
    handles += [Patch(color=DIM_COLORS[d], label=f"{d} communication") for d in dims]
    handles += [Patch(facecolor="white", edgecolor="0.75", label="idle (blank) within the rank's step window")]
    if critical is not None:
        handles += [Line2D([], [], color=CRITICAL_PATH_COLOR, linewidth=2, label="critical path"),
                    Line2D([], [], color=CRITICAL_PATH_COLOR, linewidth=1.2, linestyle=":",
                           label="critical path through idle time")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def _draw_path(ax: plt.Axes, critical: pl.DataFrame, rows: dict[int, int], origin: int) -> None:
    """The path in its lanes' middle: bold over work and communication, thin and dotted over idle, vertical where it
    jumps (line collections, so a path of many thousand segments draws at once)."""
    from matplotlib.collections import LineCollection

    path = critical.select(pl.col("rank").replace_strict(rows, return_dtype=pl.Float64).alias("y") + 0.5,
                           ((pl.col("start_ns") - origin) / 1e6).alias("x0"),
                           ((pl.col("end_ns") - origin) / 1e6).alias("x1"), (pl.col("kind") == "idle").alias("idle"))
    for idle, width, style in ((False, 2.4, "solid"), (True, 1.2, "dotted")):
        spans = path.filter(pl.col("idle") == idle)
        ax.add_collection(LineCollection([((x0, y), (x1, y)) for y, x0, x1 in spans.select("y", "x0", "x1")
                                          .iter_rows()], colors=CRITICAL_PATH_COLOR, linewidths=width,
                                         linestyles=style))
    jumps = path.with_columns(pl.col("y").shift(1).alias("from_y")).filter(pl.col("from_y") != pl.col("y"))
    ax.add_collection(LineCollection([((x0, y0), (x0, y1)) for x0, y0, y1 in jumps.select("x0", "from_y", "y")
                                      .iter_rows()], colors=CRITICAL_PATH_COLOR, linewidths=1.2))


def comm_heatmaps(pairs: pl.DataFrame, world: int, path: Path, title: str) -> None:
    """Two rank × rank heatmaps from comm_matrix rows (src, dst, bytes, time_ms, assumed_bytes): traffic and achieved
    bandwidth, each in the unit its largest cell calls for; cells whose bytes an all-to-all's even split assumes
    are hatched; a panel whose cells are all equal (to the 3 digits a cell prints) says so instead of a colour bar."""
    import numpy as np

    summed = pairs.group_by("src", "dst").agg(pl.col("bytes").sum(), pl.col("time_ms").sum(),
                                              pl.col("assumed_bytes").sum())
    size = max(world, int(summed["src"].max()) + 1, int(summed["dst"].max()) + 1)
    traffic, bandwidth = np.full((size, size), np.nan), np.full((size, size), np.nan)
    assumed = []
    for src, dst, nbytes, ms, guessed in summed.iter_rows():
        traffic[src, dst] = nbytes
        bandwidth[src, dst] = nbytes / (ms / 1e3) if ms else np.nan
        if guessed:
            assumed.append((src, dst))
    cell = 0.5 if size <= 16 else 0.25  # inches: room for a 4-character label at 8 ranks
    side = min(max(cell * size, 3.0), 10.0)
    fig, axes = plt.subplots(1, 2, figsize=(2 * side + 4.5, side + 2.4))
    for ax, values, units, heading, cmap in ((axes[0], traffic, BINARY_BYTES, "traffic", "viridis"),
                                             (axes[1], bandwidth, BANDWIDTH, "achieved bandwidth", "magma")):
        shown = values[~np.isnan(values)]
        unit, factor, meaning = unit_for(float(shown.max()) if shown.size else 0.0, units)
        scaled = values / factor
        low, high = (float(shown.min()) / factor, float(shown.max()) / factor) if shown.size else (0.0, 1.0)
        equal = f"{low:.3g}" == f"{high:.3g}"  # as the cells print: a spread in the 4th digit is no spread
        image = ax.imshow(scaled, cmap=cmap, origin="upper", vmin=low - 1 if equal else low,
                          vmax=high + 1 if equal else high)
        if equal:
            heading += f": every pair {high:.3g} {unit} ({meaning})"
        else:
            heading += f" in {unit} ({meaning})"
            fig.colorbar(image, ax=ax, label=unit, shrink=0.8)
        for src, dst in assumed:
            ax.add_patch(plt.Rectangle((dst - 0.5, src - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white",
                                       linewidth=0))
        if size <= 16:
            for (i, j), v in np.ndenumerate(scaled):
                if not np.isnan(v):
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7 if size <= 8 else 6,
                            color="black" if image.norm(v) > 0.6 else "white",  # on the cell's colour, over hatching
                            bbox={"facecolor": image.cmap(image.norm(v)), "edgecolor": "none", "pad": 1})
            ax.set_xticks(range(size))
            ax.set_yticks(range(size))
            ax.tick_params(labelsize=7 if size <= 8 else 6)
        ax.set_xlabel("destination rank")
        ax.set_ylabel("source rank")
        ax.set_title(heading, fontsize=9)
    if assumed:
        title += ("\nhatched: an all-to-all's bytes split evenly over its group, assumed (collectives record no "
                  "per-peer split)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93 if assumed else 0.96))  # the suptitle above the panel titles
    save_figure(fig, path, dpi=130)


def memory_timeline(samples: pl.DataFrame, windows: pl.DataFrame, path: Path, title: str,
                    unit: tuple[str, float, str] | None = None) -> None:
    """Allocated (solid) and reserved (dashed) memory over time, one color per rank (at most 16 drawn), a sample
    holding its level until the next; step starts as dotted vertical lines. ``unit`` (units.unit_for of
    BINARY_BYTES): the one the table beside it uses; by default the one the largest sample calls for."""
    if unit is None:
        unit = unit_for(max(samples["allocated_bytes"].max() or 0, samples["reserved_bytes"].max() or 0), BINARY_BYTES)
    name, factor, meaning = unit
    origin = min(samples["ts_ns"].min(), windows["start_ns"].min() if windows.height else samples["ts_ns"].min())
    ranks = sorted(set(samples["rank"].to_list()))
    shown = ranks[:: max(1, len(ranks) // 16)][:16]
    fig, ax = plt.subplots(figsize=(12, 5))
    colors = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20")  # tab20 pairs neighbours in one hue
    for i, rank in enumerate(shown):
        part = samples.filter(pl.col("rank") == rank)
        x = ((part["ts_ns"] - origin) / 1e6).to_list()
        color = colors(i % 20)
        ax.step(x, (part["allocated_bytes"] / factor).to_list(), where="post", color=color, linewidth=1,
                label=f"rank {rank} allocated")
        if part["reserved_bytes"].fill_null(0).max() > 0:
            ax.step(x, (part["reserved_bytes"] / factor).to_list(), where="post", color=color, linewidth=1,
                    linestyle="--", label=f"rank {rank} reserved")
    for start, step in windows.group_by("step").agg(pl.col("start_ns").min()).select("start_ns", "step").iter_rows():
        x = (start - origin) / 1e6
        ax.axvline(x, color="0.6", linestyle=":", linewidth=0.8)
        ax.annotate(f"step {step}", (x, 1), xycoords=("data", "axes fraction"), xytext=(2, -10),
                    textcoords="offset points", fontsize=7, color="0.4")
    ax.set_xlabel("time since the first sample or step start (ms)")
    ax.set_ylabel(f"memory ({name} = {meaning})")
    suffix = "" if len(shown) == len(ranks) else f" ({len(shown)} of {len(ranks)} ranks drawn)"
    ax.set_title(title + suffix, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def whatif_bars(frame: pl.DataFrame, path: Path, title: str, step: Interval, measured_ms: float) -> None:
    """Per rank, the measured step's stacked parts (left bar) beside the predicted ones (right bar, hatched), ranks
    grouped by stage, each predicted bar with its replay residual as an error bar; after the ranks, the step (the
    median rank's TOTAL) measured beside predicted, with the prediction's interval ``step`` as a bold error bar
    labelled [low, high] and its level."""
    frame = frame.sort(pl.col("stage").fill_null(-1), "rank")
    xs, stage_labels = _stage_positions(frame["stage"].to_list())
    fig, ax = plt.subplots(figsize=(max(9.0, min(0.5 * len(xs) + 6, 40.0)), 5))
    for offset, prefix, hatch in ((-0.2, "", None), (0.2, "predicted_", "//")):
        bottom = [0.0] * len(xs)
        for part, color in PART_COLORS.items():
            values = [max(v, 0.0) for v in frame[f"{prefix}{part}_ms"].to_list()]
            if part not in ("COMP", "IDLE") and not any(frame[f"{part}_ms"].to_list() + values):
                continue
            ax.bar([x + offset for x in xs], values, bottom=bottom, width=0.38, color=color, edgecolor="0.3",
                   linewidth=0.3, hatch=hatch, label=f"{label(part)} ms" if prefix == "" else None)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.errorbar([x + 0.2 for x in xs], frame["predicted_TOTAL_ms"].to_list(), yerr=frame["error_bar_ms"].to_list(),
                fmt="none", ecolor="black", elinewidth=1.2, capsize=4, capthick=1.2, zorder=3,
                label="per rank: ± the plain replay's residual")
    x = max(xs, default=0) + 2  # the step, apart from the ranks
    ax.bar(x - 0.2, measured_ms, width=0.38, color="white", edgecolor="0.3", linewidth=0.8)
    ax.bar(x + 0.2, step.value, width=0.38, color="white", edgecolor="0.3", linewidth=0.8, hatch="//")
    level = f"{100 * step.level:.0f}%"
    ax.errorbar([x + 0.2], [step.value], yerr=[[step.value - step.low], [step.high - step.value]], fmt="o",
                color="tab:red", markersize=4, elinewidth=2.5, capsize=8, capthick=2.5, zorder=4,
                label=f"step: predicted [low, high] ({level} interval)")
    ax.annotate(f"{step.value:,.1f} ms\n[{step.low:,.1f}, {step.high:,.1f}]\n({level})", (x + 0.2, step.high),
                xytext=(0, 6), textcoords="offset points", ha="center", va="bottom", fontsize=7, color="tab:red")
    ax.set_ylim(top=max(ax.get_ylim()[1], step.high * 1.18))  # room for the interval's label
    ranks = frame["rank"].to_list()
    ticks = xs if len(xs) <= 64 else xs[:: len(xs) // 32]
    ax.set_xticks([*ticks, x], [*(str(ranks[xs.index(t)]) for t in ticks), "step\n(median rank)"], fontsize=7)
    _bar_limits(ax, [*xs, x])
    ax.set_xlim(right=x + 1.4)  # room for the interval's label
    for x, text in stage_labels:
        ax.annotate(text, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -28), textcoords="offset points",
                    ha="center", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//"))
    labels.append("predicted (right bar of each pair)")
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel(("rank (grouped by pipeline stage)" if stage_labels else "rank") + ": measured | predicted",
                  labelpad=18 if stage_labels else 4)
    ax.set_ylabel("time per step (ms)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def ops_bars(frame: pl.DataFrame, by: str, path: Path, title: str) -> None:
    """`traceana ops` rows as horizontal bars, COMP and each dim's exposed wait stacked, largest on top."""
    frame = frame.reverse()
    names = [n if len(n) <= 60 else "..." + n[-57:] for n in frame[by].to_list()]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.3 * len(names) + 1.5)))
    left = [0.0] * len(names)
    for part, color in PART_COLORS.items():
        if f"{part}_ms" not in frame.columns or not frame[f"{part}_ms"].sum():
            continue
        values = frame[f"{part}_ms"].to_list()
        ax.barh(names, values, left=left, color=color, edgecolor="0.3", linewidth=0.3, label=f"{label(part)} ms")
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("time per rank-step (ms)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def roofline_chart(frame: pl.DataFrame, roofs: list[tuple[str, float]], hbm_gb_per_s: float, path: Path,
                   title: str, labelled: int = 10) -> None:
    """Log-log roofline: each row of ``frame`` (traceana.analyses.roofline.measure) a point at its intensity and
    achieved TFLOP/s, its area by total kernel time, coloured by family; the roofs min(peak, intensity x HBM), one per
    peak in ``roofs`` (label, TFLOP/s); the ``labelled`` longest numbered on the plot (clear of each other and of
    the points, :func:`_place_labels`) and named beside it. Rows without FLOPs (copies, fills) cannot sit on a log
    axis: a line under the plot counts them."""

    drawn = frame.filter(pl.col("FLOP_per_B") > 0).sort("total_ms", descending=True)
    if drawn.is_empty():
        raise TraceanaError("no op with FLOPs to place on the roofline plot")
    low = min(drawn["FLOP_per_B"].min() / 3, 0.03)
    high = max(drawn["FLOP_per_B"].max() * 3, max(p for _, p in roofs) * 3e3 / hbm_gb_per_s)
    fig, (ax, side) = plt.subplots(1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [3, 2]})
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    handles = []
    for (name, peak), style in zip(roofs, ["-", "--", ":", "-."], strict=False):
        handles += ax.plot(xs, [min(peak, x * hbm_gb_per_s / 1e3) for x in xs], color="black", linestyle=style,
                           linewidth=1.2, label=f"roof: {name} {peak:,.0f} TFLOP/s, ridge "
                           f"{peak * 1e3 / hbm_gb_per_s:,.0f} FLOP/B")
    biggest = drawn["total_ms"].max()
    for family, color in FAMILY_COLORS.items():
        part = drawn.filter(pl.col("family") == family)
        if part.height:
            ax.scatter(part["FLOP_per_B"].to_list(), part["TFLOP_per_s"].to_list(),
                       s=[20 + 500 * t / biggest for t in part["total_ms"].to_list()], color=color, alpha=0.55,
                       edgecolor="black", linewidth=0.4)
            handles.append(Line2D([], [], marker="o", linestyle="", color=color, markeredgecolor="black",
                                  markeredgewidth=0.4, label=family))
    lines = []
    for i, row in enumerate(drawn.head(labelled).iter_rows(named=True), start=1):
        what = f"{row['op']} {row.get('shapes') or ''}".strip()
        lines.append(f"{i:>2} {row['kernel'][:58]}\n   {what[:58]}\n   {row['total_ms']:,.2f} ms, "
                     f"{row['TFLOP_per_s']:,.2f} TFLOP/s, {row['GB_per_s']:,.0f} GB/s, {row['roof_pct']:,.0f}% of roof")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved to or from HBM)")
    ax.set_ylabel("achieved TFLOP/s (1e12 FLOP/s)")
    ax.grid(True, which="major", color="0.9", linewidth=0.6)
    if skipped := frame.height - drawn.height:
        ax.annotate(f"{skipped} row{'s' if skipped > 1 else ''} without FLOPs (copies, fills) not drawn",
                    (0.99, 0.01), xycoords="axes fraction", ha="right", va="bottom", fontsize=7, color="0.4")
    side.axis("off")
    side.legend(handles=handles, fontsize=7, loc="upper left", title="roofs; op families (point area: total kernel "
                "time)", title_fontsize=7)
    side.text(0, 0, "\n".join(lines), transform=side.transAxes, fontsize=6.5, va="bottom", family="monospace")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    points = list(zip(drawn["FLOP_per_B"], drawn["TFLOP_per_s"], strict=True))
    radii = [math.sqrt(20 + 500 * t / biggest) / 2 for t in drawn["total_ms"]]  # marker area s is in points²
    _place_labels(ax, points[:labelled], list(zip(points, radii, strict=True)))  # after the layout is final
    save_figure(fig, path, dpi=130)


def _place_labels(ax: plt.Axes, points: list[tuple[float, float]],
                  markers: list[tuple[tuple[float, float], float]]) -> None:
    """Number the points 1, 2 ... each on a leader line from its point, where the number's box overlaps no number
    placed before it and no marker (centre, radius in points), and stays in the axes: the first free of 16
    directions on rings of growing radius."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = ax.figure.dpi / 72
    placed: list[Bbox] = []
    for (x, y), radius in markers:
        (cx, cy), r = ax.transData.transform((x, y)), radius * scale
        placed.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
    for i, point in enumerate(points, start=1):
        note = ax.annotate(str(i), point, xytext=(0, 0), textcoords="offset points", fontsize=8, fontweight="bold",
                           ha="center", va="center", arrowprops={"arrowstyle": "-", "color": "0.4", "linewidth": 0.6},
                           bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
        turn = (i % 2) * math.pi / 16  # neighbours start half a step apart
        for radius in range(14, 400, 8):
            for k in range(16):
                angle = turn + 2 * math.pi * k / 16
                note.xyann = (radius * math.cos(angle), radius * math.sin(angle))
                box = _text_box(note, renderer)
                if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1) \
                        and not any(box.overlaps(other) for other in placed):
                    break
            else:
                continue
            break
        placed.append(_text_box(note, renderer))


def _text_box(note: Annotation, renderer: RendererBase) -> Bbox:
    """The window extent of an annotation's text at its current offset with a 4-pixel margin (its background box),
    without its leader line."""
    note.update_positions(renderer)
    return Text.get_window_extent(note, renderer).padded(4)


def launch_timeline(delays: pl.DataFrame, queues: pl.DataFrame, ranks: pl.DataFrame, steps: pl.DataFrame, path: Path,
                    title: str) -> None:
    """Two panels over one time axis (ms since the run's first launch). Top: the launch delay per time bucket, all
    ranks pooled (median and p95, log scale), with the launch cost (the ranks' median delay onto an idle device)
    dashed. Bottom: the queue length of the streams with the longest mean queue (at most 8 drawn), each bucket's
    max (solid) and time-weighted mean (dotted). Step starts as dotted vertical lines."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    width = float((delays["end_ms"] - delays["start_ms"]).max() or 1)
    gaps = (delays["start_ms"].diff() > 1.5 * width).fill_null(False)  # buckets without launches: break the line
    delays = pl.concat([delays, delays.filter(gaps).with_columns(
        pl.col("start_ms") - width, pl.col("end_ms") - width, pl.lit(None, pl.Float64).alias("p50_delay_us"),
        pl.lit(None, pl.Float64).alias("p95_delay_us")).select(delays.columns)]).sort("start_ms")
    mid = ((delays["start_ms"] + delays["end_ms"]) / 2).to_list()
    top.plot(mid, delays["p50_delay_us"].fill_null(float("nan")).to_list(), color="tab:blue", linewidth=1.2,
             label="median delay")
    top.plot(mid, delays["p95_delay_us"].fill_null(float("nan")).to_list(), color="tab:red", linewidth=1,
             label="p95 delay")
    cost = ranks["launch_cost_us"].median()
    if cost is not None:
        top.axhline(cost, color="0.3", linestyle="--", linewidth=1,
                    label=f"launch cost {cost:,.1f} us (median delay onto an idle device)")
    top.set_yscale("log")
    top.set_ylabel("launch call start to kernel start (us)")
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    means = queues.group_by("rank", "stream").agg(pl.col("mean_queue").mean()).sort(
        "mean_queue", "rank", "stream", descending=[True, False, False])
    shown = means.head(8)
    colors = plt.get_cmap("tab10")
    for i, (rank, stream, _) in enumerate(shown.iter_rows()):
        part = queues.filter((pl.col("rank") == rank) & (pl.col("stream") == stream))
        x = part["start_ms"].to_list()
        bottom.step(x, part["max_queue"].to_list(), where="post", color=colors(i), linewidth=1,
                    label=f"rank {rank} stream {stream} (max)")
        bottom.step(x, part["mean_queue"].to_list(), where="post", color=colors(i), linewidth=0.8, linestyle=":")
    bottom.set_ylabel("queued events (launched, not started)")
    bottom.set_xlabel("time since the run's first launch (ms); dotted: bucket mean")
    suffix = "" if shown.height == means.height else f" ({shown.height} of {means.height} streams drawn)"
    bottom.set_title("queue length per stream" + suffix, fontsize=9)
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for start, step in steps.select(pl.col("start_ns") / 1e6, "step").iter_rows():
        for ax in (top, bottom):
            ax.axvline(start, color="0.6", linestyle=":", linewidth=0.8)
        top.annotate(f"step {step}", (start, 1), xycoords=("data", "axes fraction"), xytext=(2, -10),
                     textcoords="offset points", fontsize=7, color="0.4")
    top.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def diff_bars(parts: pl.DataFrame, path: Path, title: str) -> None:
    """`diff --plot`: per stage, each part's ms per typical step in A (solid) beside B (hatched), in the part's colour,
    with B − A written over each pair; a part zero in both runs is left out. ``parts``: breakdown_diff's rows."""
    shown = occurring(parts).filter(pl.col("part").is_in(["TOTAL", *PART_COLORS]))
    stages = shown["stage"].unique(maintain_order=True).to_list()
    names = [p for p in ["TOTAL", *PART_COLORS] if p in set(shown["part"].to_list())]
    fig, ax = plt.subplots(figsize=(max(9.0, min(1.1 * len(names) * len(stages) + 4, 40.0)), 5))
    ticks: list[tuple[float, str]] = []
    for s, stage in enumerate(stages):
        for i, part in enumerate(names):
            row = shown.filter((pl.col("stage").is_null() if stage is None else pl.col("stage") == stage)
                               & (pl.col("part") == part))
            if row.is_empty():
                continue
            a, b = (row[c][0] or 0.0 for c in ("ms_A", "ms_B"))
            x = s * (len(names) + 1) + i
            color = "white" if part == "TOTAL" else PART_COLORS[part]
            ax.bar(x - 0.2, a, width=0.38, color=color, edgecolor="0.25", linewidth=0.6)
            ax.bar(x + 0.2, b, width=0.38, color=color, edgecolor="0.25", linewidth=0.6, hatch="//")
            ax.annotate(f"{b - a:+,.3g}", (x, max(a, b)), xytext=(0, 3), textcoords="offset points", ha="center",
                        fontsize=7)
            ticks.append((x, label(part)))
        if stage is not None and len(stages) > 1:
            ax.annotate(f"stage {stage}", (s * (len(names) + 1) + (len(names) - 1) / 2, 0),
                        xycoords=("data", "axes fraction"), xytext=(0, -40), textcoords="offset points",
                        ha="center", fontsize=9)
    ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("time per typical step (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(facecolor="white", edgecolor="0.25", label="A (solid)"),
                       Patch(facecolor="white", edgecolor="0.25", hatch="//", label="B (hatched)")],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
