"""compare's picture: estimated against measured, one color per dimension, on log axes with the identity line."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl
from matplotlib.axes import Axes

from traceana.analyses.breakdown import label
from traceana.model.compare import DIMS, PEAK, RunComparison
from traceana.render.colours import PART_COLORS
from traceana.render.plots import save_figure

COLORS = {**PART_COLORS, "COMP": "0.35", "IDLE": "tab:olive", "TOTAL": "black", "peak_memory": "tab:cyan"}
ORDER = {d: i for i, d in enumerate((*DIMS, "peak_memory"))}


# How each kind of estimate is drawn: traceana's filled, another estimator's hollow, traceana's before a fit as x.
KINDS = {"estimate": ("o", True, ""), "reference": ("o", False, " (reference estimate)"),
         "before fit": ("x", True, " (before the fit)")}


def run_scatter(result: RunComparison, path: Path, title: str, before: RunComparison | None = None) -> None:
    """One point per (stage, dim) — per dim when the run has no stages — and the peak memory of each stage;
    ``before``: the same comparison before ``compare --fit``, drawn beside it."""
    def points(comparison: RunComparison, kind: str) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        frame = comparison.by_stage if comparison.by_stage is not None else comparison.by_dimension
        time = frame.select("dim", measured="measured_ms", estimated="estimated_ms", kind=pl.lit(kind))
        memory = None if comparison.memory is None else comparison.memory.select(
            dim=pl.lit("peak_memory"), measured="measured_peak_MiB", estimated="estimated_peak_MiB", kind=pl.lit(kind))
        return time, memory

    time, memory = points(result, "estimate")
    if before is not None:
        time_before, memory_before = points(before, "before fit")
        time = pl.concat([time, time_before])
        memory = None if memory is None or memory_before is None else pl.concat([memory, memory_before])
    _draw(time, memory, path, title)


def sweep_scatter(frame: pl.DataFrame, path: Path, title: str, before: pl.DataFrame | None = None) -> None:
    """One point per (row, quantity): traceana's estimate filled, a reference estimate (CSV estimated_*) hollow,
    and with ``before`` (the rows before ``compare --fit``) the estimates before the fit as crosses."""
    parts = [frame.select("quantity", "measured", "estimated", kind=pl.lit("estimate"))]
    if "reference" in frame.columns:
        parts.append(frame.filter(pl.col("reference").is_not_null()).select(
            "quantity", "measured", estimated="reference", kind=pl.lit("reference")))
    if before is not None:
        parts.append(before.select("quantity", "measured", "estimated", kind=pl.lit("before fit")))
    both = pl.concat(parts).select(pl.col("quantity").str.replace(r"_(ms|MiB)$", "").alias("dim"), "measured",
                                   "estimated", "kind", memory=pl.col("quantity") == PEAK)
    memory = both.filter("memory").drop("memory")
    _draw(both.filter(~pl.col("memory")).drop("memory"), memory, path, title)


def _draw(time: pl.DataFrame, memory: pl.DataFrame | None, path: Path, title: str) -> None:
    """A panel per frame that has points; columns: dim, measured, estimated, kind (a key of KINDS)."""
    panels = [(f, unit) for f, unit in ((time, "time per step (ms)"), (memory, "peak memory (MiB)"))
              if f is not None and f.height]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels) + 1, 6), squeeze=False)
    for ax, (points, unit) in zip(axes[0], panels, strict=True):
        _panel(ax, points, unit)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def _panel(ax: Axes, points: pl.DataFrame, unit: str) -> None:
    """Log-log scatter with y = x; points at or below 0 cannot be drawn on log axes and are counted in the title."""
    shown = points.filter((pl.col("measured") > 0) & (pl.col("estimated") > 0))
    groups = shown.group_by("dim", "kind").agg("measured", "estimated")
    size, alpha = (28, 0.8) if shown.height <= 200 else (8, 0.5)  # big sweeps: small, see-through points
    kinds = list(KINDS)
    for dim, kind, measured, estimated in sorted(groups.iter_rows(),
                                                 key=lambda g: (ORDER.get(g[0], 99), kinds.index(g[1]))):
        color = COLORS.get(dim, "tab:gray")
        marker, filled, suffix = KINDS[kind]
        face = color if filled else "none"
        ax.scatter(measured, estimated, s=size, marker=marker, facecolors=face if marker == "o" else None,
                   edgecolors=color if marker == "o" else None, color=color if marker != "o" else None,
                   linewidths=1.0, alpha=alpha * (0.6 if kind == "before fit" else 1.0), label=label(dim) + suffix)
    if shown.height:
        low = min(shown["measured"].min(), shown["estimated"].min()) / 1.5
        high = max(shown["measured"].max(), shown["estimated"].max()) * 1.5
        ax.plot([low, high], [low, high], color="0.5", linestyle="--", linewidth=1, label="estimated = measured")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xscale("log")
        ax.set_yscale("log")
    hidden = points.height - shown.height
    ax.set_title(f"{unit}" + (f" ({hidden} points with a side at 0 not shown)" if hidden else ""), fontsize=10)
    ax.set_xlabel(f"measured {unit}")
    ax.set_ylabel(f"estimated {unit}")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
