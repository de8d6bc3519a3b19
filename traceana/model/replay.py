"""Replay a run from its dependency graph (graph.py): every node at the earliest time its edges allow, from each
rank's first window start, with the measured lengths (DESIGN §8). The simulated timeline is then measured exactly as a
measured one: its device events and windows go into an in-memory store with this version's views, so the replayed
breakdown is the §4 breakdown of the simulated timeline, not a second definition of it.

The schedule is a longest-path pass over the graph in topological order (Kahn's algorithm), each node's time
depending on its predecessors'. Narrow graphs are walked node by node in Python over ``array.array`` buffers (about
0.4 µs an edge; 8 bytes an entry, a fifth of lists of Python ints); graphs of :data:`WIDE` ranks or more level by
level, every ready node at once in NumPy: a level costs ~15 µs however narrow, so the walk pays where levels are
wide (the ranks run side by side) and not on one rank's chain of thousands.

windows.py runs this a window of steps at a time: :func:`replay_run` (and what-if, advise) through it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl

from traceana.analyses.breakdown import PARTS
from traceana.errors import TraceanaError
from traceana.model.graph import Graph

if TYPE_CHECKING:
    from traceana.model.windows import Replayed
from traceana.store import schema
from traceana.store.dataset import READ_MEMORY

NEVER = -(2 ** 62)


# Ranks from which the longest path walks level by level (:func:`_by_levels`): synthesized runs of 8 steps, node by
# node against level by level, 16 ranks 0.15 / 0.19 s, 32 ranks 0.24 / 0.22 s, 64 ranks 0.48 / 0.28 s, 1,024 ranks
# 9.6 / 3.3 s; one rank of hta_rank3of8 (18k levels of 2 edges) 0.016 / 0.25 s.
WIDE = 32


def longest_path(graph: Graph, weight: np.ndarray | None = None, keep: np.ndarray | None = None) -> np.ndarray:
    """Each node's earliest time: roots at their measured times, every other node the max over its incoming edges
    of (predecessor's time + weight). ``weight`` and ``keep`` (a mask of edges; None: all) are a what-if's
    edits."""
    w = graph.weight if weight is None else weight
    # the edges ``keep`` drops lead to one more node, whose time nothing reads: a copy of their targets, not of every
    # edge's three columns (0.6 GiB at 39 M edges)
    nodes = graph.n_nodes + (keep is not None)
    dst = graph.dst if keep is None else np.where(keep, graph.dst, graph.n_nodes).astype(graph.dst.dtype)
    # each node's first edge (edges are sorted by source, graph.py): counted, not searched for (a binary search per
    # node took 2 s of each replay at 29 M nodes)
    ptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(graph.src, minlength=nodes), out=ptr[1:])
    waiting = np.bincount(dst, minlength=nodes)
    t = np.full(nodes, NEVER, np.int64)
    t[graph.roots] = graph.root_ns
    t[graph.pinned] = graph.pinned_ns
    t, left = (_by_levels if len(graph.roots) >= WIDE else _node_by_node)(ptr, dst, w, waiting, t)
    if stuck := int(np.count_nonzero(left[:graph.n_nodes])):
        raise TraceanaError(f"run {graph.run_id!r}: {stuck} nodes of its dependency graph wait on each other "
                            "(collective instances matched across ranks in an order the ranks did not run them?); "
                            "the run cannot be replayed")
    return t[:graph.n_nodes]


def _node_by_node(ptr: np.ndarray, dst: np.ndarray, w: np.ndarray, waiting: np.ndarray, times: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(times, each node's predecessors never walked) of Kahn's walk one node at a time; ``ptr``: each node's
    first edge."""
    ready = np.flatnonzero(waiting == 0).tolist()
    first, targets, weights, left, t = (_buffer(a) for a in (ptr, dst, w, waiting, times))
    while ready:
        u = ready.pop()
        tu = t[u]
        for k in range(first[u], first[u + 1]):
            v = targets[k]
            if tu + weights[k] > t[v]:
                t[v] = tu + weights[k]
            left[v] -= 1
            if left[v] == 0:
                ready.append(v)
    return np.frombuffer(t, np.int64), np.frombuffer(left, np.int64)


def _by_levels(ptr: np.ndarray, dst: np.ndarray, w: np.ndarray, waiting: np.ndarray, t: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(times, each node's predecessors never walked) of Kahn's walk one level at a time: every edge out of the
    ready nodes relaxed at once, the nodes whose last predecessor that was the next level."""
    ready = np.flatnonzero(waiting == 0)
    while ready.size:
        first = ptr[ready]
        count = ptr[ready + 1] - first
        total = int(count.sum())
        if not total:
            break
        edge = np.repeat(first - np.cumsum(count) + count, count) + np.arange(total)  # the ready nodes' edges
        v = dst[edge]
        np.maximum.at(t, v, np.repeat(t[ready], count) + w[edge])
        np.subtract.at(waiting, v, 1)
        ready = _distinct(v[waiting[v] == 0], waiting)
    return t, waiting


def _distinct(nodes: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """``nodes`` once each, in no particular order, without a sort (np.unique's sort took 17 s of 18k levels at
    1,024 ranks): each writes its position at its entry of ``scratch`` (zero there, and zero again after); of a
    repeated node, the one whose write stayed is kept."""
    at = -1 - np.arange(len(nodes))
    scratch[nodes] = at
    kept = nodes[scratch[nodes] == at]
    scratch[nodes] = 0
    return kept


def _buffer(values: np.ndarray) -> array:
    """``values`` as an int64 ``array.array``: indexed from Python as fast as a list, 8 bytes an entry."""
    return array("q", np.ascontiguousarray(values, np.int64).tobytes())


def replayed_windows(windows: pl.DataFrame, opens: pl.Expr | None = None) -> pl.DataFrame:
    """Each step window replayed (rank, step, start_ns, end_ns) from its measured one (a graph's windows, sorted by
    rank and start, with last_ns / first_ns: its events' last replayed end and first replayed start): it starts
    its lead before its first event (a rank's first window, ``opens``, no later than measured) and ends where the
    rank's next one starts, the last at its last end plus its tail. ``opens``: by default a rank's first row."""
    rank = pl.col("rank")
    opens = (rank != rank.shift(1)).fill_null(True) if opens is None else opens
    return (windows
            .with_columns(pl.coalesce(pl.col("first_ns") - pl.col("lead_ns"), "start_ns").alias("moved_start"))
            .with_columns(pl.when(opens).then(pl.min_horizontal("start_ns", "moved_start"))
                          .otherwise(pl.col("moved_start")).alias("new_start"))
            .with_columns(pl.coalesce(pl.col("new_start").shift(-1).over(rank),
                                      pl.col("last_ns") + pl.col("tail_ns"), "end_ns").alias("new_end"))
            .select("rank", "step", pl.col("new_start").alias("start_ns"),
                    pl.max_horizontal("new_end", "new_start").alias("end_ns")))


@cache
def _empty_store() -> duckdb.DuckDBPyConnection:
    """An in-memory store with this version's tables and views, and no rows: set up once per process (the schema
    and two dozen views take about 0.1 s to define, as long as a small run's whole replay). Its DuckDB is capped as
    a dataset reader's, spilling to a private folder removed at exit: uncapped, the breakdown of 1,024 synthesized
    ranks' replay took 1.5 GiB beside the graph."""
    spill = tempfile.mkdtemp(prefix="traceana-replay-")
    atexit.register(shutil.rmtree, spill, ignore_errors=True)
    con = duckdb.connect(config={"memory_limit": READ_MEMORY, "temp_directory": spill})
    con.execute(schema.schema_sql())
    for view in schema.view_sql():
        con.execute(view)
    return con


@cache
def _columns(table: str) -> list[tuple[str, str]]:
    """(name, type) of each column of ``table`` in this version's schema, in order."""
    return _empty_store().execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ? ORDER BY column_index", [table]).fetchall()


# What a simulated run gives each table the views read: the frame ('events' or 'windows' of the run, or the
# measured run's 'ranks'), the columns it holds, the rows; every other column is NULL ('replay' for evidence).
_FILLED = {
    "device_events": ("events", ("rank", "event_id", "stream", "start_ns", "end_ns", "name", "category"), ""),
    "collectives": ("events", ("rank", "event_id", "op", "dim", "instance"), "WHERE op IS NOT NULL"),
    "steps": ("windows", ("rank", "step", "start_ns", "end_ns"), ""),
    "ranks": ("ranks", None, ""),  # every column but run_id, as measured
}


@contextmanager
def simulated_store(runs: Sequence[tuple[str, pl.DataFrame, pl.DataFrame]],
                    ranks: pl.DataFrame) -> Iterator[duckdb.DuckDBPyConnection]:
    """A store holding simulated runs, each (run id, events, windows): its device events, collectives, windows (as
    the steps table) and a copy of ``ranks`` (the measured run's), with the views of queries/*.sql over them.

    Nothing is copied: a cursor of :func:`_empty_store` registers the frames and shadows each table with a temporary
    view of the same name over them (DuckDB binds a view's tables in the connection that queries it, its temporary
    objects first), so each store sees only its own runs. Copying them into the tables cost 2.3 GiB for the 4.86 M
    events of 1,024 synthesized ranks, on top of the frames."""
    con = _empty_store().cursor()
    try:
        con.register("sim_ranks", ranks)
        for i, (_, events, windows) in enumerate(runs):
            con.register(f"sim_events_{i}", events.select(*_FILLED["device_events"][1], "op", "dim", "instance"))
            con.register(f"sim_windows_{i}", windows.select(*_FILLED["steps"][1]))
        for table, (frame, held, rows) in _FILLED.items():
            branches = [_select(table, run_id, held or tuple(c for c in ranks.columns if c != "run_id"),
                                f"sim_{frame}" if frame == "ranks" else f"sim_{frame}_{i}", rows)
                        for i, (run_id, _, _) in enumerate(runs)]
            con.execute(f"CREATE TEMP VIEW {table} AS {' UNION ALL '.join(branches)}")
        yield con
    finally:
        con.close()


def _select(table: str, run_id: str, held: Sequence[str], source: str, rows: str) -> str:
    """One run's rows of ``table`` from the registered frame ``source``, every column typed as the table's."""
    run = run_id.replace("'", "''")
    values = {"run_id": f"'{run}'", "evidence": "'replay'"} | {c: f'"{c}"' for c in held}
    columns = ", ".join(f'CAST({values.get(name, "NULL")} AS {kind}) AS "{name}"' for name, kind in _columns(table))
    return f"SELECT {columns} FROM {source} {rows}"


def breakdown_of(con: duckdb.DuckDBPyConnection, run_id: str | None = None, step: int | None = None) -> pl.DataFrame:
    """rank_step_breakdown (of ``run_id``, else every run of the store, with its run_id first; of every step, or
    ``step``): rank, pp, step, then the parts in ns."""
    parts = f"rank, pp, step, TOTAL_ns, {', '.join(p + '_ns' for p in PARTS)}, OVERLAPPED_ns"
    where = "" if step is None else "AND step = $step"
    params = {} if step is None else {"step": step}
    if run_id is None:
        return con.sql(f"SELECT run_id, {parts} FROM rank_step_breakdown WHERE TRUE {where} "
                       "ORDER BY run_id, step, rank", params=params).pl()
    return con.sql(f"SELECT {parts} FROM rank_step_breakdown WHERE run_id = $run {where} ORDER BY step, rank",
                   params={"run": run_id, **params}).pl()


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


def meets(events: pl.DataFrame, windows: pl.DataFrame) -> np.ndarray:
    """Per event, whether it touches its rank's window in ``windows`` (one a rank; ends included): a replayed window
    of steps (windows.py) is measured from these alone."""
    rank, at = events["rank"].to_numpy(), windows["rank"].to_numpy()
    size = int(max(rank.max(initial=0), at.max(initial=0))) + 1
    lo = np.full(size, np.iinfo(np.int64).max)  # a rank without a window there keeps nothing
    hi = np.full(size, np.iinfo(np.int64).min)
    lo[at], hi[at] = windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy()
    return (events["end_ns"].to_numpy() >= lo[rank]) & (events["start_ns"].to_numpy() <= hi[rank])


def replay_run(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None,
               window_events: int | None = None) -> tuple[Replayed, pl.DataFrame]:
    """(the run replayed, per rank and step, of every step or ``step``: measured vs replayed breakdown, the holds
    it could not explain), nothing changed. The whole run is replayed either way (steps depend on the ones
    before), a window of steps at a time (windows.py; ``window_events``: its size, by default WINDOW_EVENTS)."""
    from traceana.analyses.breakdown import check_step
    from traceana.model import windows

    if step is not None:
        check_step(con, run_id, step)
    measured = breakdown_of(con, run_id)  # first: DuckDB's peak for it, over a large dataset, then comes alone
    run = windows.replayed(con, run_id, window_events)
    frame = side_by_side(measured, run.breakdown)
    held = run.windows.select("rank", "step", (pl.col("held_ns") / 1e6).alias("unexplained_hold_ms"),
                              (pl.col("external_ns") / 1e6).alias("external_hold_ms"))
    frame = frame.join(held, on=["rank", "step"], how="left")
    return run, frame if step is None else frame.filter(pl.col("step") == step)


def summary(frame: pl.DataFrame) -> dict[str, float]:
    """The replay error over rank-steps: median and worst |error| in %, and their count."""
    errors = frame["error_pct"].abs()
    return {"rank_steps": len(errors), "median_abs_error_pct": float(errors.median() or 0),
            "worst_abs_error_pct": float(errors.max() or 0)}
