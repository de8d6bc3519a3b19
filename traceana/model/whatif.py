"""What-if: edit a step's dependency graph and replay it (DESIGN §8).

A change is ``KEY=TARGET[:FACTOR]``; several compose, applied in the order given:

- ``dim=TP:0.5``       the transfers of TP collectives take 0.5x as long (what 2x bandwidth would do)
- ``op=AllToAll:0.7``  the transfers of one collective op
- ``pg=3:0.5``         the transfers of one process group's collectives (its id in `traceana info`)
- ``link=0-4:2``       the link between ranks 0 and 4 at half its speed: their point-to-point messages, and the
                       collectives of every group holding both (a ring runs at its slowest link's pace, so the whole
                       collective stretches: the bound for a ring that crosses that link)
- ``kernel=*flash*:0.8`` compute / memcpy / memset events whose name matches the pattern (fnmatch, any case)
- ``kernel=*flash*:roof=60`` those of them the roofline costs (`traceana kernels --roofline`) brought to 60% of their
                       roof: each event at its op shape's achieved share / 60% of its time (never slower); events
                       the roofline cannot cost, or already above it, keep theirs
- ``host=0``           host time between launches scaled (0: every launch at once, the bound no launch mechanism
                       passes)
- ``host=capturable:0`` only the host time CUDA graphs of the steady forward / backward remove: between launches
                       of one step, outside the optimizer and data loading, not across a synchronization
                       (:func:`traceana.model.graph.capturable_host_edges`)
- ``rank=5:median``    rank 5's work scaled to the median COMP of its peers (its stage's other ranks, or all others
                       without a layout), step by step; ``rank=*:median`` every rank to its stage's median;
                       ``rank=5:1.4`` rank 5's work 1.4x (`traceana predict` gives each rank its own factor)
- ``stage=0:median``   the stage's ranks scaled so its mean COMP is the median of the other stages' means;
                       ``stage=0:1.3`` the stage's work 1.3x (every rank of it)
- ``overlap=DP``       nothing waits for DP communication any more: it runs in the background (the bound)
- ``overlap=DP:backward`` the gradient reduce overlapped with the backward in the measured buckets: each rank-step's
                       DP collectives but its last (whose gradients the backward makes last) ran beside the backward,
                       so nothing waits or queues behind them; the last stays where it is, exposed

The prediction is the measured step moved by the replayed gain: ``measured + (what-if replay - replay)``, part by
part, so the residual of the plain replay cancels; that residual is its error bar. What the graph cannot predict:
a change of layout, micro-batch or schedule changes the graph itself, which needs the estimator (`traceana predict`).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl

from traceana.analyses.breakdown import PARTS
from traceana.errors import TraceanaError
from traceana.model import graph as dependency
from traceana.model.graph import Graph
from traceana.model.intervals import Interval

if TYPE_CHECKING:
    from traceana.model.replay import Windows

KEYS = ("dim", "op", "pg", "link", "kernel", "host", "rank", "stage", "overlap")
WORK = ("compute", "memcpy", "memset")
DIMS = ("TP", "CP", "EP", "DP", "PP", "UNKNOWN")
FACTORS = (1e-6, 1e6)  # the range a factor (other than 0) may take


@dataclass(frozen=True)
class Change:
    key: str
    target: str
    factor: float | None   # None: to the median (or, with roof, to that share of the roof)
    roof: float | None = None  # kernel=PATTERN:roof=P: the percent of their roof the matched kernels reach
    backward: bool = False     # overlap=DP:backward: every DP collective of a rank-step but its last

    def __str__(self) -> str:
        if self.roof is not None:
            return f"{self.key}={self.target}:roof={self.roof:g}"
        if self.key == "host":
            return f"host={self.target + ':' if self.target else ''}{self.factor:g}"
        if self.key == "overlap":
            return f"overlap={self.target}{':backward' if self.backward else ''}"
        return f"{self.key}={self.target}:{'median' if self.factor is None else f'{self.factor:g}'}"


def parse(spec: str) -> Change:
    """One ``--change`` spec (see the module doc); a one-line error for anything else."""
    key, eq, value = spec.partition("=")
    key = key.strip().lower()
    if not eq or key not in KEYS:
        raise TraceanaError(f"--change {spec!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)}")
    if key == "host":
        region, colon, amount = value.rpartition(":")
        if colon and region.strip().lower() != "capturable":
            raise TraceanaError(f"--change {spec!r}: host takes a factor (host=0) or host=capturable:FACTOR")
        return Change(key, "capturable" if colon else "", _factor(spec, amount))
    if key == "overlap":
        dim, colon, scope = value.strip().upper().partition(":")
        if dim not in DIMS[:-1]:
            raise TraceanaError(f"--change {spec!r}: overlap takes a dim: {', '.join(DIMS[:-1])}")
        if colon and (scope != "BACKWARD" or dim != "DP"):
            raise TraceanaError(f"--change {spec!r}: overlap takes a dim (overlap=TP), or overlap=DP:backward")
        return Change(key, dim, 0.0, backward=bool(colon))
    target, colon, amount = value.rpartition(":")
    if not colon or not target:
        raise TraceanaError(f"--change {spec!r}: expected {key}=TARGET:FACTOR")
    if key in ("rank", "stage"):
        median = amount.strip().lower() == "median"
        if not (target == "*" and key == "rank") and not re.fullmatch(r"\d+", target):
            raise TraceanaError(f"--change {spec!r}: {key} must be a number{' or *' if key == 'rank' else ''}")
        if not median and target == "*":
            raise TraceanaError(f"--change {spec!r}: every rank takes ':median' (its stage's median compute); one "
                                "rank or stage also a factor, rank=5:1.4, stage=0:1.3")
        return Change(key, target, None if median else _factor(spec, amount))
    if key == "link":
        ends = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", target)
        if not ends or ends[1] == ends[2]:
            raise TraceanaError(f"--change {spec!r}: link takes two different ranks, link=A-B:FACTOR")
        a, b = sorted((int(ends[1]), int(ends[2])))
        return Change(key, f"{a}-{b}", _factor(spec, amount))
    if key == "kernel" and amount.strip().lower().startswith("roof="):
        try:
            pct = float(amount.strip()[5:])
        except ValueError:
            pct = math.nan
        return Change(key, target, None, roof_percent(pct, f"--change {spec!r}: roof=P"))
    if key == "dim" and target.upper() not in DIMS:
        raise TraceanaError(f"--change {spec!r}: dim is one of {', '.join(DIMS)}")
    return Change(key, target.upper() if key == "dim" else target, _factor(spec, amount))


def roof_percent(pct: float, what: str) -> float:
    """``pct`` checked as a share of a roof in percent (0 < P <= 100), else a one-line error naming ``what``."""
    if not 0 < pct <= 100:
        raise TraceanaError(f"{what} takes a percent of the roof, 0 < P <= 100")
    return pct


def _factor(spec: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceanaError(f"--change {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceanaError(f"--change {spec!r}: the factor must be a finite number >= 0")
    if value and not FACTORS[0] <= value <= FACTORS[1]:
        raise TraceanaError(f"--change {spec!r}: the factor must be 0 or within {FACTORS[0]:g}..{FACTORS[1]:g} "
                            "(a step's nanoseconds times it must stay a time)")
    return value


def kernel_pattern(target: str) -> re.Pattern[str]:
    """What ``kernel=TARGET`` matches: the kernel names fnmatch's pattern takes, in any case."""
    return re.compile(fnmatch.translate(target), re.IGNORECASE)


def selected(graph: Graph, change: Change, roofs: np.ndarray | None = None) -> np.ndarray | None:
    """The events whose lengths ``change`` scales (a mask), or None for a change that is not a set of events
    (host, median and stage changes, overlap); a ``roof=`` change only those below its roof (``roofs``:
    :func:`roof_shares`)."""
    ev = graph.events
    comm = _of_category(graph, "comm")
    work = _of_category(graph, *WORK)
    if change.key in ("dim", "overlap"):
        return comm & (_dims(graph) == change.target).fill_null(False).to_numpy()
    if change.key == "pg":
        return comm & (ev["pg"].cast(pl.String).fill_null("") == change.target).to_numpy()
    if change.key == "link":
        a, b = map(int, change.target.split("-"))
        rank, peer = ev["rank"], ev["peer"]
        p2p = ((rank == a) & (peer == b)) | ((rank == b) & (peer == a))  # a message: its two ends alone
        ranks = graph.groups["ranks"]
        both = peer.is_null() & ev["pg"].cast(pl.String).is_in(
            graph.groups.filter(ranks.list.contains(a) & ranks.list.contains(b))["pg"].implode())
        return comm & (p2p | both).fill_null(False).to_numpy()
    if change.key == "op":
        return comm & (ev["op"].cast(pl.String).fill_null("").str.to_lowercase() == change.target.lower()).to_numpy()
    if change.key == "kernel":
        pattern = kernel_pattern(change.target)
        names = [name for name in ev["name"].unique().to_list() if pattern.match(name)]  # once per name
        mask = ev["name"].is_in(names).to_numpy() & work
        if change.roof is not None:
            mask &= np.nan_to_num(roofs, nan=np.inf) < change.roof if roofs is not None else False
        return mask
    if change.key == "rank" and change.factor is not None:
        return work & (ev["rank"] == int(change.target)).to_numpy()
    return None


def roof_shares(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per event the roofline can cost (rank, event_id, roof_pct): the percent of its roof its op shape reached (the
    roofline by shape: the op call that launched it, by its op, input shapes and longest kernel; mean over the
    shape's rows weighted by time); the roofline's one-line error for a run without one."""
    from traceana.analyses import roofline

    roof = roofline.measure(con, run_id).frame
    keys = ["op", "input_dims", "kernel"]
    shapes = roof.group_by(keys).agg(((pl.col("roof_pct") * pl.col("total_ms")).sum() / pl.col("total_ms").sum())
                                     .alias("roof_pct"))
    calls = con.sql("SELECT o.rank, o.event_id, k.op, k.input_dims, k.kernel FROM event_ops o JOIN op_kernels k "
                    "USING (run_id, rank, op_id) WHERE o.run_id = ?", params=[run_id]).pl()
    return calls.join(shapes, on=keys, nulls_equal=True).select("rank", "event_id", "roof_pct")


def roofs_of(graph: Graph, shares: pl.DataFrame) -> np.ndarray:
    """Per event of ``graph``, its :func:`roof_shares` percent, NaN where the roofline cannot cost it."""
    return (graph.events.select("rank", "event_id").join(shares, on=["rank", "event_id"], how="left",
                                                         maintain_order="left")["roof_pct"]
            .fill_null(np.nan).to_numpy())


def lasts(graph: Graph, mask: np.ndarray) -> pl.DataFrame:
    """Each rank-step's last event of ``mask`` (the latest start): rank, event_id."""
    rows = graph.events.select("rank", "step", "start_ns", "event_id").filter(pl.Series(mask))
    return rows.sort("start_ns").group_by("rank", "step").agg(pl.col("event_id").last()).select("rank", "event_id")


def but_last(graph: Graph, mask: np.ndarray, last: pl.DataFrame | None = None) -> np.ndarray:
    """``mask`` without each rank-step's last event of it (:func:`lasts` of the graph, or ``last``: the run's,
    for a graph of some steps, whose earlier events' rank-steps it holds in part)."""
    last = lasts(graph, mask) if last is None else last
    key = pl.struct("rank", "event_id")
    return mask & ~graph.events.select(key.is_in(last.select(key)[:, 0].implode())).to_series().to_numpy()


def _of_category(graph: Graph, *categories: str) -> np.ndarray:
    """Per event, whether its category is one of ``categories``: compared in polars on the categorical's codes, not
    as an array of Python strings (5.5 s of advise at 9.7 M events)."""
    return graph.events["category"].is_in(categories).fill_null(False).to_numpy()


def _dims(graph: Graph) -> pl.Series:
    """Each event's dim, its first part where a dim joins several (EP-DP: EP); null for none. Split as text only
    where there is one (most events have none: 0.65 s a call at 9.7 M events when every row was split)."""
    return graph.events["dim"].cast(pl.String).str.split("-").list.first()


class Has:
    """What a run has that a change may ask for: the dims and ops of its communication and the names of its compute,
    copy and set kernels, seen a graph at a time (once per window for every change set); what a change that matches
    nothing is told the run has instead."""

    def __init__(self) -> None:
        self.dims: set[str] = set()
        self.ops: set[str] = set()
        self.names: set[str] = set()

    def see(self, graph: Graph, own: np.ndarray) -> None:
        """Add what ``graph``'s own events (``own``: not an earlier window's) have."""
        ev = graph.events
        comm = pl.Series(_of_category(graph, "comm") & own)
        self.dims |= set(_dims(graph).filter(comm).drop_nulls()) - {""}
        self.ops |= set(ev["op"].filter(comm).drop_nulls().cast(pl.String).unique().to_list())
        self.names |= set(ev["name"].filter(pl.Series(_of_category(graph, *WORK) & own)).cast(pl.String)
                          .unique().to_list())


class Matches:
    """Whether each change matches something in a run, seen a graph at a time (the whole run's, or each window's:
    replay.Windows), and what the run has instead (``has``, shared by the change sets checked together);
    :meth:`check` is the one-line error for a change that matches nothing."""

    def __init__(self, run_id: str, changes: list[Change], has: Has) -> None:
        self.run_id, self.changes, self.has = run_id, changes, has
        self.matched = [False] * len(changes)
        self.bucketed = [False] * len(changes)  # overlap=DP:backward: a DP collective before a rank-step's last
        self.host = self.capturable = False
        self.named: list[bool] = [False] * len(changes)  # kernel=...:roof=: a kernel so named, at any roof

    def see(self, graph: Graph, own: np.ndarray, roofs: np.ndarray | None = None,
            last: dict[int, pl.DataFrame] | None = None) -> None:
        """Note what ``graph``'s own events (``own``: not an earlier window's) and host edges match."""
        for i, change in enumerate(self.changes):
            if change.key == "host":  # the one change that reads the graph's edges (inspect's ``edges``)
                self.host |= bool((graph.kind == dependency.HOST).any())
                self.matched[i] |= self.host
                if change.target:
                    self.capturable |= bool(dependency.capturable_host_edges(graph).any())
                continue
            mask = selected(graph, change, roofs)
            if mask is None:
                self.matched[i] = True
                continue
            mask &= own
            self.matched[i] |= bool(mask.any())
            if change.backward and mask.any():
                self.bucketed[i] |= bool(but_last(graph, mask, (last or {}).get(i)).any())
            if change.roof is not None:
                self.named[i] |= bool((selected(graph, Change("kernel", change.target, 1.0)) & own).any())

    def check(self) -> None:
        """A one-line error for a change that matches nothing in the run, naming what the run has."""
        for i, change in enumerate(self.changes):
            if change.key == "host":
                if not self.host:
                    raise TraceanaError(f"--change {change}: run {self.run_id!r} has no host launch records to "
                                        "scale (a CPU-only or Ascend trace)")
                if change.target and not self.capturable:
                    raise TraceanaError(f"--change {change}: run {self.run_id!r} has no host time between launches "
                                        "outside the optimizer and data loading")
                continue
            if change.backward and self.matched[i] and not self.bucketed[i]:
                raise TraceanaError(f"--change {change}: run {self.run_id!r} reduces its gradients in one DP "
                                    "collective a step: no bucket runs before the last (`overlap=DP` is the bound)")
            if self.matched[i]:
                continue
            raise TraceanaError(f"--change {change}: matches nothing in run {self.run_id!r}, which has "
                                f"{self._has(i, change)}")

    def _has(self, i: int, change: Change) -> str:
        """What the run has instead of what ``change`` asks for."""
        if change.key in ("dim", "overlap"):
            dims = self.has.dims
            return f"communication of dims {', '.join(sorted(dims))}" if dims else "no communication"
        if change.key == "op":
            return f"collective ops {', '.join(sorted(self.has.ops)) or 'none'}"
        if change.key == "pg":
            return "no communication on it"
        if change.key == "link":
            return (f"no message between ranks {change.target.replace('-', ' and ')} and no process group holding "
                    "both (`traceana comm --matrix` shows who talks to whom)")
        if change.key == "kernel":
            import difflib

            names = sorted(self.has.names)
            like = difflib.get_close_matches(change.target.strip("*").lower(), [n.lower() for n in names], 3, 0.3)
            if change.roof is not None and self.named[i]:
                return (f"no kernel so named below {change.roof:g}% of its roof that the roofline costs "
                        "(`traceana kernels --roofline`)")
            return (f"no compute, copy or set kernel named so; the nearest: {', '.join(like)}" if like
                    else f"{len(names)} kernel names, none like it (`traceana kernels` lists them)")
        return f"no work on rank {change.target}"


def edit(graph: Graph, changes: list[Change], measured: pl.DataFrame, roofs: np.ndarray | None = None,
         last: dict[int, pl.DataFrame] | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(weights, kept edges (None: every edge), events that still end their window) after ``changes``.
    ``measured``: the run's breakdown per rank and step (rank, pp, step, COMP_ns), for the median changes, which
    take each step's own; ``roofs``: :func:`roofs_of`, for ``roof=`` changes; ``last``: per change (its index)
    the run's :func:`lasts` for an ``overlap=DP:backward``, where the graph holds some of the run's steps."""
    weight = graph.weight.astype(np.float64)
    keep = None
    ends_window = np.ones(graph.n, bool)
    ev = graph.events
    work = _of_category(graph, *WORK)
    lengths = (graph.kind == dependency.RUN) | (graph.kind == dependency.TRANSFER)
    length_of = np.where((graph.event >= 0) & lengths, graph.event, -1)
    hit = length_of >= 0

    def scale(factor: np.ndarray) -> None:  # per event; 1 leaves it
        weight[hit] *= factor[length_of[hit]]

    for i, change in enumerate(changes):
        mask = selected(graph, change, roofs)
        if change.roof is not None:  # each event to the roof share: achieved / target of its time
            scale(np.where(mask, np.nan_to_num(roofs, nan=change.roof) / change.roof, 1.0))
        elif change.key == "overlap":  # nothing waits for the collectives put in the background
            background = but_last(graph, mask, (last or {}).get(i)) if change.backward else mask
            out_of = np.zeros(graph.n_nodes, bool)
            out_of[graph.n + np.flatnonzero(background)] = True
            # they still hold their stream, except the buckets before the last: those ran during the backward
            held = np.zeros(len(weight), bool) if change.backward else graph.kind == dependency.STREAM
            dropped = out_of[graph.src] & ~held
            keep = ~dropped if keep is None else keep & ~dropped
            ends_window &= ~background
        elif mask is not None:
            scale(np.where(mask, change.factor, 1.0))
        elif change.key == "host":
            host = dependency.capturable_host_edges(graph) if change.target else graph.kind == dependency.HOST
            weight[host] *= change.factor
        elif change.key == "stage" and change.factor is not None:  # every rank of the stage
            ranks = measured.filter(pl.col("pp") == int(change.target))["rank"].unique()
            scale(np.where(work & ev["rank"].is_in(ranks.implode()).to_numpy(), change.factor, 1.0))
        else:  # rank or stage to the median
            factors = _to_median(change, measured).with_columns(  # a rank without compute has no median to reach
                pl.when(pl.col("factor").is_finite()).then("factor").otherwise(1.0).alias("factor"))
            per_event = (ev.select("rank", "step").join(factors, on=["rank", "step"], how="left")
                         ["factor"].fill_null(1.0).to_numpy())
            scale(np.where(work, per_event, 1.0))
    return np.round(weight, out=weight).astype(np.int64), keep, ends_window  # rounded in place: 8 bytes an edge


def _to_median(change: Change, measured: pl.DataFrame) -> pl.DataFrame:
    """(rank, step, factor) for a median change, from each step's own COMP: ``rank=R`` scales R's work to the
    median of its stage's other ranks, ``rank=*`` every rank to its stage's median (the balance point), ``stage=P``
    the stage's ranks so its mean COMP is the median of the other stages' means."""
    comp = measured.select("rank", "step", pl.col("pp").fill_null(-1).alias("stage"), "COMP_ns")
    if change.key == "rank" and change.target == "*":
        return comp.select("rank", "step", (pl.col("COMP_ns").median().over("step", "stage") / pl.col("COMP_ns"))
                           .alias("factor"))
    if change.key == "rank":
        rank = int(change.target)
        own = comp.filter(pl.col("rank") == rank)
        peers = (comp.join(own.select("step", "stage"), on=["step", "stage"]).filter(pl.col("rank") != rank)
                 .group_by("step").agg(pl.col("COMP_ns").median().alias("peers")))
        return own.join(peers, on="step").select("rank", "step", (pl.col("peers") / pl.col("COMP_ns")).alias("factor"))
    stage = int(change.target)
    means = comp.group_by("step", "stage").agg(pl.col("COMP_ns").mean().alias("mean"))
    others = means.filter(pl.col("stage") != stage).group_by("step").agg(pl.col("mean").median().alias("peers"))
    target = means.filter(pl.col("stage") == stage).join(others, on="step").select(
        "step", "stage", (pl.col("peers") / pl.col("mean")).alias("factor"))
    return comp.join(target, on=["step", "stage"]).select("rank", "step", "factor")


def check_targets(changes: list[Change], ranks: list[int], stages: set[int | None], run_id: str,
                  groups: set[str] | None = None) -> None:
    """A one-line error for a rank, stage or process group the run lacks."""
    for change in changes:
        if change.key == "pg" and groups is not None and change.target not in groups:
            raise TraceanaError(f"--change {change}: run {run_id!r} has no process group {change.target!r} "
                                "(`traceana info` lists them)")
        for r in map(int, change.target.split("-")) if change.key == "link" else ():
            if r not in ranks:
                raise TraceanaError(f"--change {change}: run {run_id!r} has no rank {r} (ranks "
                                    f"{min(ranks)}..{max(ranks)})")
        if change.key == "rank" and change.target != "*" and int(change.target) not in ranks:
            raise TraceanaError(f"--change {change}: run {run_id!r} has no rank {change.target} (ranks "
                                f"{min(ranks)}..{max(ranks)})")
        if change.key == "stage":
            known = sorted(s for s in stages if s is not None)
            if not known:
                raise TraceanaError(f"--change {change}: run {run_id!r} has no stages (ingest it with --layout)")
            if int(change.target) not in known:
                raise TraceanaError(f"--change {change}: run {run_id!r} has stages {known[0]}..{known[-1]}")


@dataclass(frozen=True)
class Baseline:
    """What every what-if of a run compares against: the run ready to replay window by window (its edge counts,
    notes and holds as its whole graph gives them), its measured breakdown per rank and step, the plain replay's,
    and its process groups. Built once for many changes (advise)."""

    run: Windows
    measured: pl.DataFrame
    replayed: pl.DataFrame
    groups: frozenset[str]


def baseline(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> Baseline:
    """The run's :class:`Baseline`; its plain replay measured at ``step`` alone when what-ifs of that step only
    will be compared with it (the replay's breakdown of every step of 1,024 ranks took 11 s of advise's 130)."""
    from traceana.model import replay
    from traceana.model.replay import Windows, plain

    measured = replay.breakdown_of(con, run_id)  # first: DuckDB's peak for it comes alone
    run = Windows(con, run_id)
    groups = frozenset(r[0] for r in con.execute("SELECT pg FROM process_groups WHERE run_id = ?",
                                                 [run_id]).fetchall())
    (replayed,), _ = run.replay([plain], step=step)
    return Baseline(run, measured, replayed, groups)


def whatif_runs(con: duckdb.DuckDBPyConnection, run_id: str, change_sets: list[list[Change]],
                base: Baseline | None = None, path_step: int | None = None, step: int | None = None
                ) -> tuple[Windows, list[pl.DataFrame], pl.DataFrame | None]:
    """(the run, per set of ``change_sets`` its rows of :func:`whatif_run` (every step's, or ``step``'s), critical
    path segments of ``path_step`` after the first set) for each set applied to the whole run on its own, replayed
    together, a window of steps at a time (replay.Windows)."""
    from traceana.model import replay

    base = base or baseline(con, run_id, step)
    run, m = base.run, base.measured
    roofed = next((c for changes in change_sets for c in changes if c.roof is not None), None)
    try:
        shares = roof_shares(con, run_id) if roofed else None
    except TraceanaError as e:
        raise TraceanaError(f"--change {roofed}: {e}") from None
    for changes in change_sets:
        check_targets(changes, sorted(set(m["rank"].to_list())), set(m["pp"].to_list()), run_id, set(base.groups))
    run.for_changes()
    has = Has()
    matches = [Matches(run_id, changes, has) for changes in change_sets]
    # per set, per change that overlaps all DP collectives but each rank-step's last: the run's lasts (a window's
    # earlier events need the run's, not the window's)
    backward = [{i: pl.DataFrame(schema={"rank": pl.Int32, "event_id": pl.Int64})
                 for i, c in enumerate(changes) if c.backward} for changes in change_sets]

    def look(g: Graph, pinned: np.ndarray) -> None:
        roofs = roofs_of(g, shares) if shares is not None else None
        has.see(g, ~pinned)
        for changes, found, last in zip(change_sets, matches, backward, strict=True):
            for i in last:
                last[i] = pl.concat([last[i], lasts(g, selected(g, changes[i]) & ~pinned).cast(last[i].schema)])
            found.see(g, ~pinned, roofs, last)  # every set checked before any is replayed

    run.inspect(look, edges=any(c.key == "host" for changes in change_sets for c in changes))
    for found in matches:
        found.check()

    def edit_of(changes: list[Change], last: dict[int, pl.DataFrame]):
        roofed = shares is not None and any(c.roof is not None for c in changes)  # only roof= changes read them

        def made(g: Graph, pinned: np.ndarray) -> replay.Edit:
            return replay.Edit(*edit(g, changes, m, roofs_of(g, shares) if roofed else None, last))
        return made

    changed, segments = run.replay([edit_of(c, last) for c, last in zip(change_sets, backward, strict=True)], step,
                                   path_step)
    fixed = run.graph_windows.select("rank", "step", (pl.col("external_ns") / 1e6).alias("fixed_ms"))
    frames = [predicted(m, base.replayed, c).join(fixed, on=["rank", "step"], how="left")
              .with_columns(pl.max_horizontal("predicted_TOTAL_ms", pl.col("fixed_ms").fill_null(0.0)))
              for c in changed]  # never below the step's fixed parts (the holds nothing in the trace explains)
    return run, frames, segments


def whatif_run(con: duckdb.DuckDBPyConnection, run_id: str, changes: list[Change], path_step: int | None = None,
               base: Baseline | None = None, step: int | None = None
               ) -> tuple[Windows, pl.DataFrame, pl.DataFrame | None]:
    """(the run, per rank and step (every step, or ``step``): measured and predicted TOTAL and parts in ms with the
    error bar, critical path segments of ``path_step`` after the change) for ``changes`` applied to the whole run
    (``base``: its :func:`baseline`, when already built)."""
    from traceana.analyses.breakdown import check_step

    if path_step is not None:
        check_step(con, run_id, path_step)
    g, (frame,), segments = whatif_runs(con, run_id, [changes], base, path_step, step)
    return g, frame, segments


def whatif_step(con: duckdb.DuckDBPyConnection, run_id: str, changes: list[Change], step: int | None = None,
                base: Baseline | None = None, path: bool = False
                ) -> tuple[int, Windows, pl.DataFrame, pl.DataFrame | None]:
    """(step, the run, its rows of :func:`whatif_run`, its critical path after the change when ``path``) for one step,
    by default the second (the first carries warm-up)."""
    from traceana.analyses.critical_path import checked_step

    step = checked_step(con, run_id, step)
    g, frame, segments = whatif_run(con, run_id, changes, step if path else None, base, step)
    return step, g, frame, segments


def kind_of(changes: list[Change]) -> str:
    """The kind of a change, as intervals are calibrated per kind: its key (``rank:median``, ``rank=*:median``,
    ``rank:factor`` told apart), ``composite`` for several kinds at once."""
    kinds = set()
    for c in changes:
        if c.key == "rank":
            kinds.add("rank=*:median" if c.target == "*" else "rank:median" if c.factor is None else "rank:factor")
        elif c.key == "stage" and c.factor is not None:
            kinds.add("stage:factor")
        else:
            kinds.add(c.key)
    return kinds.pop() if len(kinds) == 1 else "composite"


def step_interval(base: Baseline, frame: pl.DataFrame, changes: list[Change], platform: str,
                  alternatives: dict[str, float] | None = None) -> Interval:
    """The predicted step (the median rank's predicted TOTAL of ``frame``, one step's rows) with its interval.
    Its spreads, measured on the run alone (log units): the replay residual of the step's rank-steps, the run's
    step-to-step spread of the step, its rank-to-rank spread, and the size of the change; ``alternatives``: other
    predictions the trace cannot rule out (absent peers held), which the interval also holds."""
    from traceana.model import intervals

    step = int(frame["step"][0])
    m = base.measured
    value = float(frame["predicted_TOTAL_ms"].median())
    measured = float(frame["TOTAL_ms"].median())
    both = m.filter(pl.col("step") == step).join(base.replayed.filter(pl.col("step") == step), on="rank",
                                                suffix="_r")
    ratio = (both["TOTAL_ns_r"] / both["TOTAL_ns"]).to_numpy()
    ratio = ratio[ratio > 0]
    spreads = {
        "replay_residual": float(np.sqrt(np.mean(np.log(ratio) ** 2))) if len(ratio) else 0.0,
        "step_to_step": intervals.log_spread(m.group_by("step").agg(pl.col("TOTAL_ns").median())["TOTAL_ns"]),
        "rank_to_rank": intervals.log_spread(both["TOTAL_ns"].to_numpy()),
    }
    fixed = float(frame["fixed_ms"].median()) if "fixed_ms" in frame.columns else 0.0
    notes = {"external_hold_ms": fixed, "external_hold_share": fixed / measured if measured else 0.0}
    wait = float(absent_wait_ms(base.run.lone, step)["wait_ms"].median() or 0.0)
    alternatives = dict(alternatives or {})
    if wait > 0:
        profiled_only = any(c.key == "stage" or (c.key == "rank" and c.target != "*") for c in changes)
        comp = float(frame["COMP_ms"].median())
        f = min(1.0, float(frame["predicted_COMP_ms"].median()) / comp) if comp else 1.0
        notes["absent_peer_wait_ms"] = wait
        if profiled_only:  # the peers do not change: what the profiled rank gains it may wait for them instead
            alternatives["absent peers unchanged, the gain waited away"] = measured
        elif f < 1:  # the absent ranks change as the profiled ones do: their lateness shrinks as the work does
            alternatives["absent peers held (their wait kept as measured)"] = value
            value = max(fixed, value - wait * (1 - f))
            notes["absent_peers"] = (f"symmetric: the absent ranks' {wait:.3f} ms of lateness scaled by the work "
                                     f"ratio {f:.3f}")
    spreads["change"] = abs(math.log(value / measured)) if value > 0 and measured > 0 else 0.0
    out = intervals.around(value, spreads, platform, kind_of(changes), "whatif", notes=notes)
    for why, other in alternatives.items():
        out = out.hull(other, other, {why: other})
    return out.clamp(fixed)


def absent_wait_ms(lone: pl.DataFrame, step: int) -> pl.DataFrame:
    """Per rank, the step's time its collectives waited for members the trace lacks (rank, wait_ms): each lone
    member's length (``lone``: graph.lone_members of the run) less the shortest of its kernel on its rank (the
    transfer when the peers were there first)."""
    alone = lone.with_columns((pl.col("ns") - pl.col("ns").min().over("rank", "name")).alias("wait"))
    return alone.filter(pl.col("step") == step).group_by("rank").agg((pl.col("wait").sum() / 1e6).alias("wait_ms"))


def whatif_interval(con: duckdb.DuckDBPyConnection, run_id: str, changes: list[Change], step: int | None = None
                    ) -> tuple[int, Windows, pl.DataFrame, pl.DataFrame | None, Interval]:
    """:func:`whatif_step` with the critical path after the change, and the predicted step's interval."""
    from traceana.analyses.critical_path import checked_step
    from traceana.model.intervals import platform_of

    step = checked_step(con, run_id, step)  # before the baseline, which replays this step only
    base = baseline(con, run_id, step)
    step, g, frame, segments = whatif_step(con, run_id, changes, step, base, path=True)
    return step, g, frame, segments, step_interval(base, frame, changes, platform_of(con, run_id))


def predicted(measured: pl.DataFrame, base: pl.DataFrame, changed: pl.DataFrame) -> pl.DataFrame:
    """Per rank, step and part: measured, predicted = measured + (changed replay - plain replay), in ms, and the
    error bar: the plain replay's |TOTAL error|."""
    parts = ["TOTAL", *PARTS]
    keys = ["rank", "step"]
    both = measured.join(base.drop("pp"), on=keys, suffix="_base").join(changed.drop("pp"), on=keys, suffix="_new")
    return both.select(
        "step", "rank", pl.col("pp").alias("stage"),
        *[(pl.col(f"{c}_ns") / 1e6).alias(f"{c}_ms") for c in parts],
        *[((pl.col(f"{c}_ns") + pl.col(f"{c}_ns_new") - pl.col(f"{c}_ns_base")) / 1e6).alias(f"predicted_{c}_ms")
          for c in parts],
        ((pl.col("TOTAL_ns_base") - pl.col("TOTAL_ns_new")) / 1e6).alias("gain_ms"),
        ((pl.col("TOTAL_ns_base") - pl.col("TOTAL_ns")).abs() / 1e6).alias("error_bar_ms"))


def by_stage(frame: pl.DataFrame) -> pl.DataFrame:
    """A prediction per stage: the mean over each stage's ranks of the measured and predicted TOTAL and parts."""
    cols = [c for c in frame.columns if c.endswith("_ms")]
    return (frame.group_by("stage").agg(pl.len().alias("ranks"), *[pl.col(c).mean() for c in cols])
            .sort("stage", nulls_last=True).select("stage", "ranks", "TOTAL_ms", "predicted_TOTAL_ms", "gain_ms",
                                                   "error_bar_ms", "COMP_ms", "predicted_COMP_ms"))
