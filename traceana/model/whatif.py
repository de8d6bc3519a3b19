"""What-if: edit a step's dependency graph and replay it (DESIGN §8).

A change is ``KEY=TARGET[:FACTOR]``; several compose, applied in the order given:

- ``dim=TP:0.5``       the transfers of TP collectives take 0.5x as long (what 2x bandwidth would do)
- ``op=AllToAll:0.7``  the transfers of one collective op
- ``kernel=*flash*:0.8`` compute / memcpy / memset events whose name matches the pattern (fnmatch, any case)
- ``host=0``           host time between launches scaled (0: every launch at once, what CUDA graphs would do)
- ``rank=5:median``    rank 5's work scaled to its group's median COMP in this step (its stage's ranks, or all
                       ranks without a layout); ``rank=*:median`` every rank
- ``stage=0:median``   the stage's ranks scaled so its mean COMP is the median of the stages' means
- ``overlap=DP``       nothing waits for DP communication any more: it runs in the background

The prediction is the measured step moved by the replayed gain: ``measured + (what-if replay - replay)``, part by
part, so the residual of the plain replay cancels; that residual is its error bar. What the graph cannot predict:
a change of layout, micro-batch or schedule changes the graph itself, which needs the estimator (`traceana predict`).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from traceana.analyses.breakdown import PARTS
from traceana.errors import TraceanaError
from traceana.model import graph as dependency
from traceana.model.graph import Graph

KEYS = ("dim", "op", "kernel", "host", "rank", "stage", "overlap")
WORK = ("compute", "memcpy", "memset")
DIMS = ("TP", "CP", "EP", "DP", "PP", "UNKNOWN")


@dataclass(frozen=True)
class Change:
    key: str
    target: str
    factor: float | None   # None: to the median

    def __str__(self) -> str:
        if self.key == "host":
            return f"host={self.factor:g}"
        if self.key == "overlap":
            return f"overlap={self.target}"
        return f"{self.key}={self.target}:{'median' if self.factor is None else f'{self.factor:g}'}"


def parse(spec: str) -> Change:
    """One ``--change`` spec (see the module doc); a one-line error for anything else."""
    key, eq, value = spec.partition("=")
    key = key.strip().lower()
    if not eq or key not in KEYS:
        raise TraceanaError(f"--change {spec!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)}")
    if key == "host":
        return Change(key, "", _factor(spec, value))
    if key == "overlap":
        dim = value.strip().upper()
        if dim not in DIMS[:-1]:
            raise TraceanaError(f"--change {spec!r}: overlap takes a dim: {', '.join(DIMS[:-1])}")
        return Change(key, dim, 0.0)
    target, colon, amount = value.rpartition(":")
    if not colon or not target:
        raise TraceanaError(f"--change {spec!r}: expected {key}=TARGET:FACTOR")
    if key in ("rank", "stage"):
        if amount.strip().lower() != "median":
            raise TraceanaError(f"--change {spec!r}: {key} changes take ':median' (the group's median compute)")
        if not (target == "*" and key == "rank") and not re.fullmatch(r"\d+", target):
            raise TraceanaError(f"--change {spec!r}: {key} must be a number{' or *' if key == 'rank' else ''}")
        return Change(key, target, None)
    if key == "dim" and target.upper() not in DIMS:
        raise TraceanaError(f"--change {spec!r}: dim is one of {', '.join(DIMS)}")
    return Change(key, target.upper() if key == "dim" else target, _factor(spec, amount))


def _factor(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceanaError(f"--change {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceanaError(f"--change {spec!r}: the factor must be a finite number >= 0")
    return value


def edit(graph: Graph, changes: list[Change], comp_ns: dict[int, int], stage_of: dict[int, int | None]
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, kept edges, events that still end the window) after ``changes``. ``comp_ns``: each rank's measured
    COMP in the step, for the median changes; ``stage_of``: each rank's stage (None without a layout)."""
    weight = graph.weight.astype(np.float64)
    keep = np.ones(len(weight), bool)
    ends_window = np.ones(graph.n, bool)
    ev = graph.events
    ranks = ev["rank"].to_numpy()
    category = ev["category"].to_numpy()
    dim = ev["dim"].fill_null("").str.split("-").list.first().fill_null("").to_numpy()
    comm = category == "comm"
    carries = graph.event >= 0
    lengths = (graph.kind == dependency.RUN) | (graph.kind == dependency.TRANSFER)
    length_of = np.where(carries & lengths, graph.event, -1)

    def scale(events: np.ndarray, factor: float) -> None:
        hit = length_of >= 0
        hit[hit] = events[length_of[hit]]
        weight[hit] *= factor

    for change in changes:
        if change.key == "dim":
            scale(comm & (dim == change.target if change.target != "UNKNOWN" else dim == "UNKNOWN"), change.factor)
        elif change.key == "op":
            scale(comm & (ev["op"].fill_null("").str.to_lowercase() == change.target.lower()).to_numpy(),
                  change.factor)
        elif change.key == "kernel":
            pattern = re.compile(fnmatch.translate(change.target), re.IGNORECASE)
            names = [name for name in ev["name"].unique().to_list() if pattern.match(name)]  # once per name
            scale(ev["name"].is_in(names).to_numpy() & np.isin(category, WORK), change.factor)
        elif change.key == "host":
            weight[graph.kind == dependency.HOST] *= change.factor
        elif change.key == "rank":
            targets = sorted(comp_ns) if change.target == "*" else [int(change.target)]
            for rank in targets:
                scale((ranks == rank) & np.isin(category, WORK), _to_median(rank, comp_ns, stage_of))
        elif change.key == "stage":
            stage = int(change.target)
            scale(np.isin(ranks, [r for r, s in stage_of.items() if s == stage]) & np.isin(category, WORK),
                  _stage_to_median(stage, comp_ns, stage_of))
        elif change.key == "overlap":
            background = comm & (dim == change.target)
            out_of = np.zeros(graph.n_nodes, bool)
            out_of[graph.n + np.flatnonzero(background)] = True
            keep &= ~(out_of[graph.src] & (graph.kind != dependency.STREAM))
            ends_window &= ~background
    return np.round(weight).astype(np.int64), keep, ends_window


def _to_median(rank: int, comp_ns: dict[int, int], stage_of: dict[int, int | None]) -> float:
    group = [comp_ns[r] for r in comp_ns if stage_of.get(r) == stage_of.get(rank)]
    return float(np.median(group)) / comp_ns[rank] if comp_ns[rank] else 1.0


def _stage_to_median(stage: int, comp_ns: dict[int, int], stage_of: dict[int, int | None]) -> float:
    means = {s: float(np.mean([c for r, c in comp_ns.items() if stage_of.get(r) == s]))
             for s in {stage_of.get(r) for r in comp_ns}}
    return float(np.median(list(means.values()))) / means[stage] if means.get(stage) else 1.0


def check_targets(changes: list[Change], ranks: list[int], stages: set[int | None], run_id: str) -> None:
    """A one-line error for a rank or stage the run lacks."""
    for change in changes:
        if change.key == "rank" and change.target != "*" and int(change.target) not in ranks:
            raise TraceanaError(f"--change {change}: run {run_id!r} has no rank {change.target} (ranks "
                                f"{min(ranks)}..{max(ranks)})")
        if change.key == "stage":
            known = sorted(s for s in stages if s is not None)
            if not known:
                raise TraceanaError(f"--change {change}: run {run_id!r} has no stages (ingest it with --layout)")
            if int(change.target) not in known:
                raise TraceanaError(f"--change {change}: run {run_id!r} has stages {known[0]}..{known[-1]}")


def whatif_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int, changes: list[Change]
                ) -> tuple[Graph, pl.DataFrame, pl.DataFrame]:
    """(graph, per rank: measured, replayed and predicted TOTAL and parts in ms with the error bar, critical path
    segments of the changed step) for ``changes`` applied to ``step``."""
    from traceana.analyses.breakdown import check_step
    from traceana.model import replay

    check_step(con, run_id, step)
    g = dependency.build(con, run_id, step)
    measured = replay.measured_breakdown(con, run_id, step)
    comp = dict(zip(measured["rank"].to_list(), measured["COMP_ns"].to_list(), strict=True))
    stage_of = dict(zip(measured["rank"].to_list(), measured["pp"].to_list(), strict=True))
    check_targets(changes, sorted(comp), set(stage_of.values()), run_id)
    base, _ = replay.simulate(con, g)
    weight, keep, ends = edit(g, changes, comp, stage_of)
    changed, segments = replay.simulate(con, g, weight, keep, ends, path=True)
    return g, predicted(measured, base, changed, step), segments


def predicted(measured: pl.DataFrame, base: pl.DataFrame, changed: pl.DataFrame, step: int) -> pl.DataFrame:
    """Per rank and part: measured, predicted = measured + (changed replay - plain replay), in ms, and the error
    bar: the plain replay's |TOTAL error|."""
    parts = ["TOTAL", *PARTS]
    both = measured.join(base, on="rank", suffix="_base").join(changed, on="rank", suffix="_new")
    return both.select(
        pl.lit(step).alias("step"), "rank", pl.col("pp").alias("stage"),
        *[(pl.col(f"{c}_ns") / 1e6).alias(f"{c}_ms") for c in parts],
        *[((pl.col(f"{c}_ns") + pl.col(f"{c}_ns_new") - pl.col(f"{c}_ns_base")) / 1e6).alias(f"predicted_{c}_ms")
          for c in parts],
        ((pl.col("TOTAL_ns_base") - pl.col("TOTAL_ns_new")) / 1e6).alias("gain_ms"),
        ((pl.col("TOTAL_ns_base") - pl.col("TOTAL_ns")).abs() / 1e6).alias("error_bar_ms"))
