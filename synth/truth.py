"""The ground truth of a synthetic run: per rank and step, where the time went, measured on the true timeline.

It applies DESIGN §4's definitions to the ops the synthesizer generated (not to anything an ingester read): a step's
window runs from the first main-chain kernel of the step to the next step's first (the last step to its last
main-chain kernel's end), as Kineto's ProfilerStep projection does (pipeline transfers are
launched from another thread, so they never open a step); COMP is the union of compute kernels; a collective's time
outside COMP is exposed, each instant split equally among the dims communicating then; IDLE is the rest. The
computation is a numpy sweep over each rank's op boundaries, independent of the SQL views it checks.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceana.synth.schedule import COLLECTIVE, COMPUTE, DIMS, RankTrace

COLUMNS = ("TOTAL_ns", "COMP_ns", "MP_WAIT_ns", "CP_WAIT_ns", "EP_WAIT_ns", "DP_WAIT_ns", "PP_WAIT_ns", "IDLE_ns",
           "OVERLAPPED_ns")


def step_windows(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) per step of one rank, true time."""
    ops = trace.ops
    main = ops.filter(pl.col("code") <= COLLECTIVE).group_by("step").agg(pl.col("start_ns").min()).sort("step")
    last = ops.filter((pl.col("step") == ops["step"].max()) & (pl.col("code") <= COLLECTIVE))["end_ns"].max()
    starts = main["start_ns"].to_numpy()
    return starts, np.append(starts[1:], last)


def breakdown(trace: RankTrace) -> pl.DataFrame:
    """rank, step and the COLUMNS (ns, float) of one rank."""
    ops = trace.ops
    w_start, w_end = step_windows(trace)
    start, end = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    lane = np.where(ops["code"].to_numpy() == COMPUTE, 0, ops["dim"].to_numpy().astype(np.int64) + 1)
    points = np.unique(np.concatenate([start, end, w_start, w_end]))
    seg_start, seg_len = points[:-1], np.diff(points)
    # how many events of each lane cover each elementary segment
    cover = np.empty((len(DIMS) + 1, len(seg_start)), dtype=np.int64)
    for c in range(len(DIMS) + 1):
        s, e = np.sort(start[lane == c]), np.sort(end[lane == c])
        cover[c] = np.searchsorted(s, seg_start, side="right") - np.searchsorted(e, seg_start, side="right")
    busy = cover[0] > 0
    talking = cover[1:] > 0
    n_dims = talking.sum(axis=0)
    step = np.searchsorted(w_start, seg_start, side="right") - 1
    inside = (step >= 0) & (seg_start < w_end[np.clip(step, 0, None)])
    exposed = np.where(~busy & (n_dims > 0), seg_len / np.maximum(n_dims, 1), 0.0)
    values = {
        "COMP_ns": np.where(busy, seg_len, 0),
        **{f"{'MP' if d == 'TP' else d}_WAIT_ns": np.where(talking[i], exposed, 0.0) for i, d in enumerate(DIMS)},
        "IDLE_ns": np.where(~busy & (n_dims == 0), seg_len, 0),
        "OVERLAPPED_ns": np.where(busy & (n_dims > 0), seg_len, 0),
    }
    n = len(w_start)
    sums = {k: np.bincount(step[inside], weights=v[inside], minlength=n) for k, v in values.items()}
    return pl.DataFrame({"rank": np.full(n, trace.rank, dtype=np.int32), "step": np.arange(n, dtype=np.int32),
                         "start_ns": w_start, "TOTAL_ns": (w_end - w_start).astype(np.float64),
                         **{k: sums[k] for k in COLUMNS[1:]}})
