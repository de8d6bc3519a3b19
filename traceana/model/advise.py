"""Advise: ranked findings, each with its measured evidence, a concrete change and the gain what-if predicts for it
(DESIGN §8). No finding without evidence from a view, no gain without a replayed prediction and its error bar.

Findings looked for, on one step (the second, or the only one):
- host-bound idle: IDLE is a large share of the step and the device waited on launches -> ``host=0`` (CUDA graphs);
- exposed communication per dim: a dim's WAIT share -> that dim's transfers 2x faster; for DP (gradients, which
  nothing in the step consumes at once), where some of it already runs beside compute, also fully overlapped;
- straggler ranks: stragglers view, COMP above the group's median -> each such rank (and all of them) to the median;
- straggler stage: the stage with the largest mean COMP -> ``stage=P:median`` (what rebalancing its layers buys).
The step's length is its slowest rank's TOTAL; a gain is measured minus predicted step, in ms.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.analyses import critical_path
from traceana.model import whatif
from traceana.model.graph import Graph

IDLE_SHARE = 0.2      # IDLE above this share of the step is worth a finding
WAIT_SHARE = 0.05     # a dim's exposed wait above this share
STRAGGLER_PCT = 5.0   # COMP this far above the group's median
OVERLAPPABLE = 0.05   # the share of DP communication that already runs beside compute, for an overlap what-if


def findings(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> tuple[int, pl.DataFrame]:
    """(step, findings sorted by predicted gain): finding, evidence, change, predicted step and gain in ms, the
    error bar in ms."""
    step = critical_path.default_step(con, run_id) if step is None else step
    measured = con.sql("SELECT * FROM rank_step_breakdown WHERE run_id = $run AND step = $step",
                       params={"run": run_id, "step": step}).pl()
    total = float(measured["TOTAL_ns"].max())
    rows: list[dict] = []

    def propose(finding: str, evidence: str, changes: list[str]) -> None:
        g, frame, _ = whatif.whatif_step(con, run_id, step, [whatif.parse(c) for c in changes])
        step_ms = float(frame["predicted_TOTAL_ms"].max())
        rows.append({"finding": finding, "evidence": evidence, "change": " ".join(changes),
                     "measured_step_ms": total / 1e6, "predicted_step_ms": step_ms,
                     "gain_ms": total / 1e6 - step_ms, "error_bar_ms": float(frame["error_bar_ms"].max()),
                     "graph": _graph_note(g)})

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
    stages = measured.group_by("pp").agg(pl.col("COMP_ns").mean()).drop_nulls("pp").sort("COMP_ns", descending=True)
    if stages.height > 1:
        slow, comp = stages.row(0)
        median = float(stages["COMP_ns"].median())
        if comp > median * (1 + STRAGGLER_PCT / 100):
            propose(f"straggler stage {slow}", f"stage_breakdown: stage {slow} mean COMP {comp / 1e6:.2f} ms, "
                    f"{100 * (comp / median - 1):.0f}% above the stages' median {median / 1e6:.2f} ms: rebalance its "
                    "layers", [f"stage={slow}:median"])
    frame = pl.DataFrame(rows, schema={"finding": pl.String, "evidence": pl.String, "change": pl.String,
                                       "measured_step_ms": pl.Float64, "predicted_step_ms": pl.Float64,
                                       "gain_ms": pl.Float64, "error_bar_ms": pl.Float64, "graph": pl.String})
    return step, frame.sort("gain_ms", descending=True)


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
