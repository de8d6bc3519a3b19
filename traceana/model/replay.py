"""Replay a run from its dependency graph (graph.py): every node at the earliest time its edges allow, from each
rank's first window start, with the measured lengths (DESIGN §8). The simulated timeline is then measured exactly as a
measured one: its device events and windows go into an in-memory store with this version's views, so the replayed
breakdown is the §4 breakdown of the simulated timeline, not a second definition of it.

The schedule is a longest-path pass over the graph in topological order (Kahn's algorithm): the one loop that runs
per node and edge, over plain lists (about 1 µs per edge), since each node's time depends on its predecessors'.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import duckdb
import numpy as np
import polars as pl

from traceana.analyses.breakdown import PARTS
from traceana.errors import TraceanaError
from traceana.model.graph import Graph
from traceana.store import schema

NEVER = -(2 ** 62)


def longest_path(graph: Graph, weight: np.ndarray | None = None, keep: np.ndarray | None = None) -> np.ndarray:
    """Each node's earliest time: roots at their measured times, every other node the max over its incoming edges
    of (predecessor's time + weight). ``weight`` and ``keep`` (a mask of edges) are a what-if's edits."""
    src, dst = graph.src, graph.dst
    w = graph.weight if weight is None else weight
    if keep is not None:
        src, dst, w = src[keep], dst[keep], w[keep]
    order = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[order], np.arange(graph.n_nodes + 1)).tolist()
    targets, weights = dst[order].tolist(), w[order].tolist()
    waiting = np.bincount(dst, minlength=graph.n_nodes).tolist()
    t = [NEVER] * graph.n_nodes
    for node, at in zip(graph.roots.tolist(), graph.root_ns.tolist(), strict=True):
        t[node] = at
    ready = np.flatnonzero(np.bincount(dst, minlength=graph.n_nodes) == 0).tolist()
    while ready:
        u = ready.pop()
        tu = t[u]
        for k in range(ptr[u], ptr[u + 1]):
            v = targets[k]
            if tu + weights[k] > t[v]:
                t[v] = tu + weights[k]
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    stuck = sum(1 for left in waiting if left)
    if stuck:
        raise TraceanaError(f"run {graph.run_id!r}: {stuck} nodes of its dependency graph wait on each other "
                            "(collective instances matched across ranks in an order the ranks did not run them?); "
                            "the run cannot be replayed")
    return np.asarray(t, np.int64)


def timeline(graph: Graph, times: np.ndarray, ends_window: np.ndarray | None = None
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(events, windows) of the simulated run: the events with their replayed start_ns / end_ns, and each rank's
    step windows. A step starts its measured lead before its first event now starts (the first step no later than
    its root), and ends where the next one starts; the last one at its last replayed end (of the events in
    ``ends_window``) plus the measured tail. So a step's length is the distance between the starts of its work and
    the next step's, wherever the time between them went."""
    n = graph.n
    start, end = times[:n], np.maximum(times[n:2 * n], times[:n])
    events = graph.events.with_columns(start_ns=pl.Series(start), end_ns=pl.Series(end))
    counted = pl.Series(np.ones(n, bool) if ends_window is None else ends_window)
    last = events.filter(counted).group_by("rank", "step").agg(pl.col("end_ns").max().alias("last_ns"))
    first = (events.filter(~pl.Series(graph.straddles, dtype=pl.Boolean)).group_by("rank", "step")
             .agg(pl.col("start_ns").min().alias("first_ns")))
    rank = pl.col("rank")
    opens = (rank != rank.shift(1)).fill_null(True)
    windows = (graph.windows.join(last, on=["rank", "step"], how="left").join(first, on=["rank", "step"], how="left")
               .sort("rank", "start_ns")
               .with_columns(pl.coalesce(pl.col("first_ns") - pl.col("lead_ns"), "start_ns").alias("moved_start"))
               .with_columns(pl.when(opens).then(pl.min_horizontal("start_ns", "moved_start"))
                             .otherwise(pl.col("moved_start")).alias("new_start"))
               .with_columns(pl.coalesce(pl.col("new_start").shift(-1).over(rank),
                                         pl.col("last_ns") + pl.col("tail_ns"), "end_ns").alias("new_end"))
               .select("rank", "step", pl.col("new_start").alias("start_ns"),
                       pl.max_horizontal("new_end", "new_start").alias("end_ns")))
    return events, windows


@cache
def _empty_store() -> duckdb.DuckDBPyConnection:
    """An in-memory store with this version's tables and views, and no rows: set up once per process (the schema
    and two dozen views take about 0.1 s to define, as long as a small run's whole replay)."""
    con = duckdb.connect()
    con.execute(schema.schema_sql())
    for view in schema.view_sql():
        con.execute(view)
    return con


@contextmanager
def simulated_store(runs: Sequence[tuple[str, pl.DataFrame, pl.DataFrame]],
                    ranks: pl.DataFrame) -> Iterator[duckdb.DuckDBPyConnection]:
    """A store holding simulated runs, each (run id, events, windows): its device events, collectives, windows (as
    the steps table) and a copy of ``ranks`` (the measured run's), with the views of queries/*.sql over them. The
    rows live in a transaction of their own on a cursor of :func:`_empty_store`, rolled back at the end, so each
    store sees only its own runs."""
    device = pl.concat([events.select(pl.lit(run_id).alias("run_id"), "rank", "event_id", "stream",
                                      "start_ns", "end_ns", pl.col("name").cast(pl.String), "category")
                        for run_id, events, _ in runs])
    comm = pl.concat([events.filter(pl.col("op").is_not_null()).select(
        pl.lit(run_id).alias("run_id"), "rank", "event_id", "op", pl.lit(None, pl.String).alias("kernel_op"),
        pl.lit(None, pl.Int64).alias("bytes"), pl.lit(None, pl.String).alias("dtype"),
        pl.lit(None, pl.String).alias("pg"), "dim", pl.lit(None, pl.Int64).alias("seq"), "instance",
        pl.lit(None, pl.Int32).alias("peer"), pl.lit("replay").alias("evidence")) for run_id, events, _ in runs])
    cut = pl.concat([windows.select(pl.lit(run_id).alias("run_id"), "rank", "step", "start_ns", "end_ns")
                     for run_id, _, windows in runs])
    known = pl.concat([ranks.with_columns(run_id=pl.lit(run_id)) for run_id, _, _ in runs])
    con = _empty_store().cursor()
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO device_events BY NAME SELECT * FROM device")  # no launch records
        con.execute("INSERT INTO collectives SELECT * FROM comm")
        con.execute("INSERT INTO steps SELECT * FROM cut")  # frames are named apart from the tables
        con.execute("INSERT INTO ranks BY NAME SELECT * FROM known")
        del device, comm, cut, known  # copied into the store: the frames' text (names, run ids) goes now
        yield con
    finally:
        con.execute("ROLLBACK")
        con.close()


def breakdown_of(con: duckdb.DuckDBPyConnection, run_id: str | None = None) -> pl.DataFrame:
    """rank_step_breakdown (of ``run_id``, else every run of the store, with its run_id first): rank, pp, step, then
    the parts in ns."""
    parts = f"rank, pp, step, TOTAL_ns, {', '.join(p + '_ns' for p in PARTS)}, OVERLAPPED_ns"
    if run_id is None:
        return con.sql(f"SELECT run_id, {parts} FROM rank_step_breakdown ORDER BY run_id, step, rank").pl()
    return con.sql(f"SELECT {parts} FROM rank_step_breakdown WHERE run_id = $run ORDER BY step, rank",
                   params={"run": run_id}).pl()


def ranks_of(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    return con.sql("SELECT * FROM ranks WHERE run_id = $run", params={"run": run_id}).pl()


def side_by_side(measured: pl.DataFrame, replayed: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step: the measured and replayed parts in ms, and the TOTAL's error in % of the measured TOTAL."""
    cols = ["TOTAL", *PARTS]
    both = measured.join(replayed, on=["rank", "step"], how="left", suffix="_r")
    return both.select(
        "step", "rank", pl.col("pp").alias("stage"),
        *[(pl.col(f"{c}_ns") / 1e6).alias(f"{c}_ms") for c in cols],
        *[(pl.col(f"{c}_ns_r") / 1e6).alias(f"replayed_{c}_ms") for c in cols],
        (100 * (pl.col("TOTAL_ns_r") - pl.col("TOTAL_ns")) / pl.col("TOTAL_ns")).alias("error_pct"))


@dataclass(frozen=True)
class Edit:
    """A what-if's edit of the graph (whatif.edit): each edge's weight, the edges kept (a mask), the events whose
    ends close their window; None for the graph as measured."""

    weight: np.ndarray | None = None
    keep: np.ndarray | None = None
    ends_window: np.ndarray | None = None


def simulate(con: duckdb.DuckDBPyConnection, graph: Graph, edits: Sequence[Edit] = (Edit(),),
             path_step: int | None = None) -> tuple[list[pl.DataFrame], pl.DataFrame | None]:
    """(per edit, the breakdown per rank and step of the graph replayed with it; critical path segments of
    ``path_step`` under the first edit, when given). The replays share one store, each a run of its own, and are
    measured by one query (advise replays eight changes of one graph)."""
    from traceana.analyses import critical_path

    names = [f"{graph.run_id}#{i}" for i in range(len(edits))]
    runs = [(name, *timeline(graph, longest_path(graph, e.weight, e.keep), e.ends_window))
            for name, e in zip(names, edits, strict=True)]
    with simulated_store(runs, ranks_of(con, graph.run_id)) as sim:
        segments = (critical_path.walk(*critical_path.load_step(sim, names[0], path_step))
                    if path_step is not None else None)
        frame = breakdown_of(sim)
    parted = frame.partition_by("run_id", as_dict=True, include_key=False)
    return [parted.get((name,), frame.clear().drop("run_id")) for name in names], segments


def replay_run(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> tuple[Graph, pl.DataFrame]:
    """(graph, per rank and step, of every step or ``step``: measured vs replayed breakdown, the holds it could not
    explain), nothing changed. The whole run is replayed either way: steps depend on the ones before."""
    from traceana.analyses.breakdown import check_step
    from traceana.model import graph as dependency

    if step is not None:
        check_step(con, run_id, step)
    g = dependency.build(con, run_id)
    (replayed,), _ = simulate(con, g)
    frame = side_by_side(breakdown_of(con, run_id), replayed)
    held = g.windows.select("rank", "step", (pl.col("held_ns") / 1e6).alias("unexplained_hold_ms"),
                            (pl.col("external_ns") / 1e6).alias("external_hold_ms"))
    frame = frame.join(held, on=["rank", "step"], how="left")
    return g, frame if step is None else frame.filter(pl.col("step") == step)


def summary(frame: pl.DataFrame) -> dict[str, float]:
    """The replay error over rank-steps: median and worst |error| in %, and their count."""
    errors = frame["error_pct"].abs()
    return {"rank_steps": len(errors), "median_abs_error_pct": float(errors.median() or 0),
            "worst_abs_error_pct": float(errors.max() or 0)}
