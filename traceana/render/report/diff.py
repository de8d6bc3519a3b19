"""`traceana diff A B --html`: what changed between two runs, as one interactive page. The first screen says how
each stage's step changed and which parts and kernels explain it; then A beside B per stage and part (bars and the
table), the kernels whose time changed most (bars) with the new and vanished ones, and the collectives. Every
number is traceana/analyses/diff.py's, as `traceana diff --json` prints it."""

from __future__ import annotations

import html
from pathlib import Path

import duckdb
import polars as pl

from traceana.analyses.breakdown import label
from traceana.analyses.diff import breakdown_diff, collective_diff, kernel_diff, occurring
from traceana.render.colours import FIRST_COLOR, SECOND_COLOR
from traceana.render.report import charts
from traceana.render.report.page import Page

KERNEL_BARS = 20  # kernels drawn in the chart of changes; the tables keep every kernel


def _stage(stage: int | None) -> str:
    return "all ranks" if stage is None else f"stage {stage}"


def first_screen(parts: pl.DataFrame, kernels: pl.DataFrame, run_a: str, run_b: str) -> str:
    """Per stage: TOTAL A -> B and the parts that moved it most; then the kernels whose time changed most."""
    items = []
    for (stage,), rows in parts.group_by(["stage"], maintain_order=True):
        total = rows.filter(pl.col("part") == "TOTAL").row(0, named=True)
        movers = (rows.filter((pl.col("part") != "TOTAL") & (pl.col("part") != "OVERLAPPED")
                              & (pl.col("ms_delta").abs() > 0))
                  .sort(pl.col("ms_delta").abs(), descending=True).head(3))
        why = "; ".join(f"{label(r['part'])} {r['ms_delta']:+,.3f} ms" for r in movers.iter_rows(named=True))
        pct = "" if total["ms_delta_pct"] is None else f" ({total['ms_delta_pct']:+.1f}%)"
        items.append(f"<li><b>{_stage(stage)}</b>: step {total['ms_A']:,.3f} → {total['ms_B']:,.3f} ms "
                     f"({total['ms_delta']:+,.3f} ms{pct}); most moved: {html.escape(why) or 'nothing'}</li>")
    top = kernels.filter(pl.col("ms_delta").is_not_null()).head(3)
    for k in top.iter_rows(named=True):
        items.append(f"<li>kernel <code>{html.escape(k['short_name'])}</code> ({k['status']}): "
                     f"{k['ms_delta']:+,.3f} ms per rank and step</li>")
    return (f'<section class="first" id="first"><p class="big">{html.escape(run_a)} (A) → {html.escape(run_b)} '
            f"(B)</p><ol>{''.join(items)}</ol></section>")


def write(con: duckdb.DuckDBPyConnection, db: Path, run_a: str, run_b: str, out: Path) -> int:
    """Write the diff page of runs A and B; returns its size in bytes."""
    parts = breakdown_diff(con, run_a, run_b)
    kernels = kernel_diff(con, run_a, run_b)
    comms = collective_diff(con, run_a, run_b)
    page = Page(f"traceana diff: {run_a} → {run_b}", f"{db}; ms per typical step (mean over each stage's ranks) "
                                                     "or per rank and step")
    shown = occurring(parts)
    bars = shown.filter(pl.col("part") != "OVERLAPPED").with_columns(
        pl.concat_str(pl.col("stage").map_elements(_stage, return_dtype=pl.String), pl.lit(" · "),
                      pl.col("part").map_elements(label, return_dtype=pl.String)).alias("stage and part"),
        pl.col("ms_A").alias("A ms"), pl.col("ms_B").alias("B ms"))
    chart = charts.grouped_bars(bars, "stage and part", {"A ms": FIRST_COLOR, "B ms": SECOND_COLOR},
                                f"A ({run_a}) beside B ({run_b}), ms per typical step", "stage and part",
                                "time per step (ms)")
    chart.xaxis.major_label_orientation = 0.8
    page.add("Breakdown per stage", page.chart(chart) + page.table(
        shown, "per stage and part: A, B, delta and %; explains_pct = the part's share of the stage's TOTAL change"))
    both = kernels.filter(pl.col("status") == "both")
    if not both.is_empty():
        top = both.head(KERNEL_BARS)
        changes = charts.bars(top, "short_name", "ms_delta", [SECOND_COLOR] * top.height,
                              f"the {top.height} kernels whose time changed most (B − A, ms per rank and step)",
                              "change (ms per rank and step)", extra={"A ms": "ms_A", "B ms": "ms_B"})
        changes.xaxis.major_label_orientation = 0.8
        page.add("Kernels that changed", page.chart(changes) + page.table(
            both.drop("status"), "every kernel in both runs, by the size of its change (ms and calls per rank and "
                                 "step)"))
    for status, heading in (("new", "Kernels new in B"), ("vanished", "Kernels vanished from A")):
        rows = kernels.filter(pl.col("status") == status)
        if not rows.is_empty():
            page.add(heading, page.table(rows.drop("status"), f"{heading} (ms and calls per rank and step)"))
    if not comms.is_empty():
        page.add("Collectives", page.table(comms, "by op and dim, per rank and step (ms include waiting)"))
    return page.write(out, first_screen(parts, kernels, run_a, run_b))
