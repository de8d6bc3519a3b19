"""The breakdown's two pictures: stacked bars per rank grouped by pipeline stage, and a Gantt of one step."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from traceana.breakdown import DIM_LANES, PARTS, WAITS
from traceana.errors import TraceanaError

COMP_COLOR = "0.55"
IDLE_COLOR = "0.93"
DIM_COLORS = dict(zip(DIM_LANES, ["tab:blue", "tab:purple", "tab:orange", "tab:green", "tab:red", "tab:brown"],
                      strict=True))
PART_COLORS = {"COMP": COMP_COLOR, **dict(zip(WAITS, DIM_COLORS.values(), strict=True)), "IDLE": IDLE_COLOR}


def save_figure(fig: Figure, path: Path, dpi: int) -> None:
    """Write ``fig`` to ``path`` and close it; a write the file system refuses is one line naming the file."""
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise TraceanaError(f"--plot {path}: cannot write the plot ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def _stage_positions(stages: list[int | None]) -> tuple[list[float], list[tuple[float, str]]]:
    """x of each rank (ranks already sorted by stage) with a one-bar gap between stages, and stage label points."""
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
        labels.append(((xs[first] + xs[-1]) / 2, f"stage {stages[-1]}" if stages[-1] is not None else "no stages"))
    return xs, labels


def breakdown_bars(frame: pl.DataFrame, path: Path, title: str) -> None:
    """One stacked bar per rank (COMP, each *_WAIT, IDLE in ms), ranks grouped by stage; OVERLAPPED beside it."""
    frame = frame.sort(pl.col("pp").fill_null(-1), "rank")
    xs, stage_labels = _stage_positions(frame["pp"].to_list())
    fig, ax = plt.subplots(figsize=(max(9.0, min(0.35 * len(xs) + 5, 40.0)), 5))
    bottom = [0.0] * len(xs)
    for part in PARTS:
        values = frame[f"{part}_ms"].to_list()
        if part in WAITS and not any(values):
            continue
        ax.bar(xs, values, bottom=bottom, width=0.7, color=PART_COLORS[part], edgecolor="0.3", linewidth=0.3,
               label=f"{part} ms")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if frame["OVERLAPPED_ms"].sum() > 0:
        ax.bar([x + 0.42 for x in xs], frame["OVERLAPPED_ms"].to_list(), width=0.12, color="black",
               label="OVERLAPPED ms (comm hidden under COMP, not in TOTAL)")
    ticks = xs if len(xs) <= 64 else xs[:: len(xs) // 32]
    ranks = frame["rank"].to_list()
    ax.set_xticks(ticks, [str(ranks[xs.index(t)]) for t in ticks], fontsize=7)
    for x, label in stage_labels:
        ax.annotate(label, (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -28), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xlabel("rank (grouped by pipeline stage)", labelpad=18)
    ax.set_ylabel("time per step (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


def timeline_gantt(windows: pl.DataFrame, intervals: pl.DataFrame, path: Path, title: str) -> None:
    """One lane per rank over one step: COMP in grey on top, each dim's communication in its color below, idle blank.

    ``windows``: rank, pp, start_ns, end_ns (lane order); ``intervals``: rank, lane, start_ns, end_ns.
    """
    origin = windows["start_ns"].min()
    dims = [d for d in DIM_LANES if d in set(intervals["lane"].to_list())]
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
    labels = [f"rank {r}" + (f" (stage {s})" if s is not None else "")
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
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_figure(fig, path, dpi=130)
