"""compare's picture: estimated against measured, one color per dimension, on log axes with the identity line."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl
from matplotlib.axes import Axes

from traceana.compare import DIMS, PEAK, RunComparison
from traceana.plots import PART_COLORS, save_figure

COLORS = {**PART_COLORS, "COMP": "0.35", "IDLE": "tab:olive", "TOTAL": "black", "peak_memory": "tab:cyan"}
ORDER = {d: i for i, d in enumerate((*DIMS, "peak_memory"))}


def run_scatter(result: RunComparison, path: Path, title: str) -> None:
    """One point per (stage, dim) — per dim when the run has no stages — and the peak memory of each stage."""
    frame = result.by_stage if result.by_stage is not None else result.by_dimension
    time = frame.select("dim", measured="measured_ms", estimated="estimated_ms", reference=pl.lit(False))
    memory = None if result.memory is None else result.memory.select(
        dim=pl.lit("peak_memory"), measured="measured_peak_MiB", estimated="estimated_peak_MiB",
        reference=pl.lit(False))
    _draw(time, memory, path, title)


def sweep_scatter(frame: pl.DataFrame, path: Path, title: str) -> None:
    """One point per (row, quantity): traceana's estimate filled, a reference estimate (CSV estimated_*) hollow."""
    parts = [frame.select("quantity", "measured", "estimated", reference=pl.lit(False))]
    if "reference" in frame.columns:
        parts.append(frame.filter(pl.col("reference").is_not_null()).select(
            "quantity", "measured", estimated="reference", reference=pl.lit(True)))
    both = pl.concat(parts).select(pl.col("quantity").str.replace(r"_(ms|MiB)$", "").alias("dim"), "measured",
                                   "estimated", "reference", memory=pl.col("quantity") == PEAK)
    memory = both.filter("memory").drop("memory")
    _draw(both.filter(~pl.col("memory")).drop("memory"), memory, path, title)


def _draw(time: pl.DataFrame, memory: pl.DataFrame | None, path: Path, title: str) -> None:
    """A panel per frame that has points; columns: dim, measured, estimated, reference (bool: draw hollow)."""
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
    groups = shown.group_by("dim", "reference").agg("measured", "estimated")
    size, alpha = (28, 0.8) if shown.height <= 200 else (8, 0.5)  # big sweeps: small, see-through points
    for dim, reference, measured, estimated in sorted(groups.iter_rows(), key=lambda g: (ORDER.get(g[0], 99), g[1])):
        color = COLORS.get(dim, "tab:gray")
        ax.scatter(measured, estimated, s=size, facecolors="none" if reference else color, edgecolors=color,
                   linewidths=1.0, alpha=alpha, label=f"{dim} (reference estimate)" if reference else dim)
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
