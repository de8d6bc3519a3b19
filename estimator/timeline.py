"""The simulated step as a timeline: a Gantt plot and a Chrome-trace JSON (Perfetto, chrome://tracing).

Each forward / backward of the pipeline simulation is cut into its compute and its exposed communication by
dimension (in the proportions of the chunk's cost; compute first, communication after), the once-a-step data
parallel tail and optimizer step follow each stage's last pass, and every gap left up to the step's end is a bubble.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.estimator import stages
from traceana.estimator.estimate import ChunkCost, Estimate

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#A6D8A8", "TP": "#C44E52", "CP": "#8172B2", "EP": "#DD8452",
          "DP": "#937860", "IDLE": "#BBBBBB", "OPT": "#DA8BC3", "P2P": "#222222", "BUBBLE": "#F2F2F2"}
LABELS = {"F": "forward", "B": "backward (input grad + recompute)", "W": "weight grad",
          "TP": "TP comm (exposed, MP_WAIT)", "CP": "CP comm (exposed)", "EP": "EP all-to-all (exposed)",
          "DP": "DP / ZeRO comm (exposed)",
          "IDLE": "host-bound wait", "OPT": "optimizer step", "P2P": "p2p transfer", "BUBBLE": "bubble"}


def _pieces(cost: ChunkCost, kind: str) -> list[tuple[str, float]]:
    if kind == "F":
        return [("F", cost.forward), ("TP", cost.tp.forward), ("CP", cost.cp.forward), ("EP", cost.ep.forward),
                ("DP", cost.dp.forward), ("IDLE", cost.idle.forward)]
    if kind == "B":
        return [("B", cost.backward + cost.recompute), ("TP", cost.tp.backward), ("CP", cost.cp.backward),
                ("EP", cost.ep.backward), ("DP", cost.dp.backward), ("IDLE", cost.idle.backward)]
    return [("W", cost.wgrad)]


def _segment_of(est: Estimate) -> dict[tuple[int, int], int]:
    """(stage, chunk label of the simulator) -> model chunk index."""
    cfg, pp = est.config, est.config.parallel.pp
    if cfg.schedule.kind == "dualpipe":
        return {**{(k, 0): k for k in range(pp)}, **{(pp - 1 - k, 1): k for k in range(pp)}}
    return {(stages.device_of_chunk(cfg, k), k // pp if cfg.schedule.kind != "zb-v" else int(k >= pp)): k
            for k in range(len(est.chunks))}


def frame(est: Estimate) -> pl.DataFrame:
    """Every interval of the simulated step: stage, kind, micro_batch, chunk, start_ms, end_ms."""
    segment = _segment_of(est)
    rows: list[tuple[int, str, int, int, float, float]] = []
    for stage, kind, mb, chunk, start, end in est.pipeline.events:
        if kind not in ("F", "B", "W"):
            rows.append((stage, kind, mb, chunk, start, end))
            continue
        pieces = [(k, d) for k, d in _pieces(est.costs[segment[(stage, chunk)]], kind) if d > 0]
        scale = (end - start) / sum(d for _, d in pieces) if pieces else 0.0
        t = start
        for k, d in pieces:
            rows.append((stage, k, mb, chunk, t, t + d * scale))
            t += d * scale
    for stage in range(est.config.parallel.pp):
        last = max((r[5] for r in rows if r[0] == stage and r[1] != "P2P"), default=0.0)
        rows.append((stage, "DP", -1, -1, last, last + est.tails[stage]))
        rows.append((stage, "OPT", -1, -1, last + est.tails[stage], last + est.tails[stage] + est.optimizer[stage]))
        rows += _gaps(stage, sorted((r[4], r[5]) for r in rows if r[0] == stage and r[1] != "P2P"), est.step_s)
    table = pl.DataFrame(rows, schema=["stage", "kind", "micro_batch", "chunk", "start_ms", "end_ms"], orient="row")
    return (table.filter(pl.col("end_ms") > pl.col("start_ms"))
            .with_columns(pl.col("start_ms") * 1e3, pl.col("end_ms") * 1e3).sort("stage", "start_ms"))


def _gaps(stage: int, spans: list[tuple[float, float]], total: float) -> list[tuple[int, str, int, int, float, float]]:
    gaps, t = [], 0.0
    for start, end in [*spans, (total, total)]:
        if start > t + 1e-12:
            gaps.append((stage, "BUBBLE", -1, -1, t, start))
        t = max(t, end)
    return gaps


def plot(est: Estimate, path: Path) -> None:
    """A Gantt chart of the simulated step, one row per pipeline stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from traceana.render.plots import save_figure

    table = frame(est)
    pp = est.config.parallel.pp
    fig, ax = plt.subplots(figsize=(15, 2.4 + 0.45 * pp))
    for (kind, stage), group in table.group_by("kind", "stage"):
        bars = list(zip(group["start_ms"].to_list(), (group["end_ms"] - group["start_ms"]).to_list(), strict=True))
        thin = kind == "P2P"
        ax.broken_barh(bars, (stage + (0.15 if thin else -0.4), 0.25 if thin else 0.8), facecolors=COLORS[kind],
                       hatch="//" if kind == "BUBBLE" else None,
                       edgecolor="#CCCCCC" if kind == "BUBBLE" else "none", linewidth=0)
    present = set(table["kind"].unique().to_list())
    ax.legend(handles=[Patch(facecolor=COLORS[k], label=LABELS[k], hatch="//" if k == "BUBBLE" else None,
                             edgecolor="#CCCCCC") for k in COLORS if k in present],
              loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)])
    ax.set_ylim(pp - 0.5, -0.5)
    ax.set_xlabel("time in step (ms)")
    ax.set_ylabel("pipeline stage")
    cfg = est.config
    ax.set_title(f"Simulated step: {cfg.schedule.kind}, pp={cfg.parallel.pp}, vpp={cfg.parallel.vpp}, "
                 f"{cfg.micro_batches} micro-batches, step {est.step_s * 1e3:,.1f} ms")
    ax.set_xlim(0, est.step_s * 1e3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def chrome_trace(est: Estimate, path: Path) -> None:
    """The simulated step as Chrome-trace JSON: one thread per stage, comm slices nested in their pass."""
    table = frame(est).filter(pl.col("kind") != "BUBBLE")
    pp = est.config.parallel.pp
    events: list[dict[str, object]] = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": s + offset,
                                        "args": {"name": f"stage {s}{suffix}"}}
                                       for s in range(pp) for offset, suffix in ((0, ""), (pp, " p2p in"))]
    events.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "traceana estimate"}})
    for stage, kind, mb, chunk, start, end in table.iter_rows():
        events.append({"name": LABELS[kind] if mb < 0 else f"{kind} mb{mb} chunk{chunk}", "cat": kind, "ph": "X",
                       "pid": 0, "tid": stage + (pp if kind == "P2P" else 0), "ts": start * 1e3,
                       "dur": (end - start) * 1e3, "args": {"micro_batch": mb, "chunk": chunk}})
    try:
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot write the trace ({exc.strerror})") from None
