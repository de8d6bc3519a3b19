"""Replay a run from its dependency graph (graph.py): every node at the earliest time its edges allow, from each
rank's first window start, with the measured lengths (DESIGN §8). The simulated timeline is then measured exactly as a
measured one: its device events and windows go into an in-memory store with this version's views, so the replayed
breakdown is the §4 breakdown of the simulated timeline, not a second definition of it.

The schedule is a longest-path pass over the graph in topological order (Kahn's algorithm), each node's time
depending on its predecessors'. Narrow graphs are walked node by node in Python over ``array.array`` buffers (about
0.4 µs an edge; 8 bytes an entry, a fifth of lists of Python ints); graphs of :data:`WIDE` ranks or more level by
level, every ready node at once in NumPy: a level costs ~15 µs however narrow, so the walk pays where levels are
wide (the ranks run side by side) and not on one rank's chain of thousands.

A run is replayed a window of steps at a time (:class:`Windows`), so that its memory follows a window's events, not
the run's, and every node gets the time the run's whole graph gives it, window by window. What a window's graph
needs from the steps before it (:class:`traceana.model.graph.Context`) is carried from window to window as a few rows
per rank and stream: each stream's last event (what the next one on the stream follows) and the event that ended
last on it (what an unexplained start is taken to wait for), the events still running into the window, the events
that later recorded waits wait for, each rank's last host point; these keep the times their own window's replay
gave them. The per-rank statistics the weights use (launch latency, queue spacing, inferred lag) are quantiles over
the whole run: one pass over the windows measures them before the pass that replays. Which starts count for the lag
depends on the other two, so that pass keeps the lag's candidates with what decides it (graph.lag_statistic).

Windows are cut only between steps no collective instance spans, where every rank's host points of the steps after
come more than :data:`~traceana.model.graph.BARRIER_NS` after those of the steps before and no recorded stream wait
points back across the cut: elsewhere an edge would point from a later window to an earlier one. A run with no such
cut is one window, its whole graph.

The events are read once into a Parquet file in the temporary folder, in step order, and each window from there.
"""

from __future__ import annotations

import atexit
import ctypes
import shutil
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from traceana.analyses.breakdown import PARTS
from traceana.errors import TraceanaError
from traceana.model import graph as dependency
from traceana.model.graph import BARRIER_NS, CARRIED_SQL, EVENTS_SQL, Context, Graph
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
def _large_arrays_returned() -> None:
    """Have glibc's malloc give arrays of 4 MiB and more their own mapping, returned to the system when freed: by
    default the threshold rises to the largest array freed (up to 32 MiB), after which a window's arrays come from
    the heap and its freed pages stay in the process. What-if over 1,024 copies of a real rank: 1,827 -> 1,701 MiB
    peak in the same time (at 128 KiB: 1,603 MiB, 15% slower). Nothing where the C library is not glibc."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if sys.platform == "linux" else None
    if mallopt is not None:
        mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD


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
    of steps (:class:`Windows`) is measured from these alone."""
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
    before), a window of steps at a time (``window_events``: its size, by default WINDOW_EVENTS)."""
    from traceana.analyses.breakdown import check_step

    if step is not None:
        check_step(con, run_id, step)
    measured = breakdown_of(con, run_id)  # first: DuckDB's peak for it, over a large dataset, then comes alone
    run = replayed(con, run_id, window_events)
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


# events a window holds before it is cut (where a cut is allowed): 1.6 M at 1,024 copies of a real rank
WINDOW_EVENTS = 1_000_000

ORDER = ["rank", "stream", "start_ns", "end_ns", "event_id"]  # EVENTS_SQL's order, which a graph's rows keep


# a window's edit: (its graph, its pinned rows) -> the edit replayed
EditOf = Callable[[Graph, np.ndarray], "Edit"]


def plain(graph: Graph, pinned: np.ndarray) -> Edit:
    """The graph as measured."""
    return Edit()


@dataclass
class Replayed:
    """A run replayed window by window: what its whole graph would say of itself (edge counts, missing_notes'
    facts, windows with held_ns and external_ns) and the replayed breakdown per rank and step."""

    counts: dict[str, int]
    facts: dict[str, int]
    windows: pl.DataFrame
    breakdown: pl.DataFrame

    @property
    def missing(self) -> list[str]:
        return dependency.missing_notes(self.facts)


def replayed(con: duckdb.DuckDBPyConnection, run_id: str, window_events: int | None = None) -> Replayed:
    """Replay ``run_id`` as measured, window by window (module doc)."""
    with Windows(con, run_id, window_events) as run:
        (breakdown,), _ = run.replay([plain])
        return Replayed(run.counts, run.facts, run.graph_windows, breakdown)


class Windows:
    """A run ready to replay window by window: its events spilled in step order, its windows, the per-rank
    statistics over the whole run (a pass of their own, where it has more than one window), and what its whole
    graph says of itself (``counts``, ``facts``, ``graph_windows``: each step window with its holds), tallied by
    the first walk that sees every window with the statistics final. A context manager: the spilled events go at
    its end."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, window_events: int | None = None) -> None:
        params = {"run": run_id}
        _large_arrays_returned()
        self.con, self.run_id = con, run_id
        self._folder = tempfile.TemporaryDirectory(prefix="traceana-windows-")
        events, self.names = _spilled(con, run_id, Path(self._folder.name) / "events.parquet")
        self.spans = cuts(con, run_id, str(events), window_events or WINDOW_EVENTS)
        self.run = _Run(run_id, events, self.names, self.spans,
                        con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = $run "
                                "ORDER BY rank, start_ns", params=params).pl(),
                        con.sql(CARRIED_SQL, params=params).pl(), _window_syncs(con, run_id, str(events), self.spans))
        self.ranks = ranks_of(con, run_id)
        self.statistics: dict[str, np.ndarray] = {}
        self._counts: dict[str, int] = {}
        self._facts: dict[str, int] = {}
        self._windows: list[pl.DataFrame] = []
        self._lone: list[pl.DataFrame] = []
        if len(self.spans) > 1:  # else the one window's graph measures them on its own events
            samples: dict[str, list[tuple[np.ndarray, ...]]] = {}
            self.run.walk(self.statistics, samples)
            size = int(self.run.firsts["rank"].max()) + 1
            self.statistics |= {name: _quantile(samples.get(name, []), size, name)
                                for name in ("launch", "least launch", "spacing")}
            self.statistics["lag"] = dependency.lag_statistic(samples.pop("lag candidates", []), self.statistics,
                                                             size)
        self.tallied = False  # the first walk over every window with the statistics final tallies the run

    def __enter__(self) -> Windows:
        return self

    def __exit__(self, *_: object) -> None:
        self._folder.cleanup()

    @property
    def counts(self) -> dict[str, int]:
        """The whole graph's edges by kind (graph.Graph.counts)."""
        return self._tallied()._counts

    @property
    def facts(self) -> dict[str, int]:
        return self._tallied()._facts

    @property
    def graph_windows(self) -> pl.DataFrame:
        windows = self._tallied()._windows
        return pl.concat(windows) if windows else pl.DataFrame()

    @property
    def missing(self) -> list[str]:
        return dependency.missing_notes(self.facts)

    @property
    def lone(self) -> pl.DataFrame:
        """The run's collective kernels with no other member in the trace (graph.lone_members)."""
        return pl.concat(self._tallied()._lone)

    def _tallied(self) -> Windows:
        """This run, its tally taken: by a walk of its own where no replay or inspection saw every window."""
        if not self.tallied:
            self.run.walk(self.statistics, {}, self._tally)
            self.tallied = True
        return self

    def for_changes(self) -> None:
        """Give each window's graph what a what-if's changes read beside its events (graph.build's groups and
        uncapturable)."""
        if self.run.groups is None:
            self.run.groups = dependency.groups(self.con, self.run_id)
            self.run.uncapturable = dependency.uncapturable(self.con, self.run_id)

    def _tally(self, g: Graph, pinned: np.ndarray) -> None:
        _add_counts(self._counts, g.counts)
        for key, value in g.facts.items():
            self._facts[key] = self._facts.get(key, 0) + value
        self._windows.append(g.windows)
        self._lone.append(dependency.lone_members(g, ~pinned))

    def inspect(self, look: Callable[[Graph, np.ndarray], None], edges: bool = True) -> None:
        """Give ``look`` each window's graph (nothing replayed; its edges kept when ``edges``: a check that reads
        only the events is spared building them) and its pinned rows: checks of a change against the whole run,
        before any replay (the run's tally taken on the way)."""
        tally = not self.tallied

        def visit(g: Graph, pinned: np.ndarray) -> None:
            if tally:
                self._tally(g, pinned)
            look(g, pinned)

        self.run.walk(self.statistics, {}, visit, edges=edges)
        self.tallied = True

    def replay(self, edits: list[EditOf], step: int | None = None, path_step: int | None = None
               ) -> tuple[list[pl.DataFrame], pl.DataFrame | None]:
        """(per edit, the breakdown per rank and step of the run replayed with it, of every step or ``step``'s;
        the critical path segments of ``path_step`` under the first edit). With a step, the windows after the one
        after its window are not replayed."""
        want = None if step is None else [s for s in (step, path_step) if s is not None]
        stop = None if want is None else min(len(self.spans) - 1,
                                             max(_window_of(self.spans, s) for s in want) + 1)
        parts: list[list[pl.DataFrame]] = [[] for _ in edits]
        pending: list = [None] * len(edits)
        ready: list = [None] * len(edits)  # each edit's newest window replayed, settled once its graph is let go
        segments: list[pl.DataFrame] = []
        tally = not self.tallied and stop in (None, len(self.spans) - 1)  # a walk of every window
        overhang: list[pl.DataFrame | None] = [None] * len(edits)

        def measure(i: int, following: tuple | None) -> None:
            """Settle edit ``i``'s pending window, now that the ``following`` one is replayed, and measure it."""
            events, final, overhang[i] = _settled(pending[i], following, self.run.firsts, overhang[i])
            if _wanted(pending[i], want):
                bd, path = _measured(events, final, self.ranks, self.run_id, step, path_step if i == 0 else None)
                parts[i].append(bd)
                if path is not None:
                    segments.append(path)

        def replay(g: Graph, pinned: np.ndarray, at: list[np.ndarray]) -> list[np.ndarray]:
            if tally:
                self._tally(g, pinned)
            out = []
            for i, edit_of in enumerate(edits):
                g.pinned_ns = at[i]
                e = edit_of(g, pinned)
                times = longest_path(g, e.weight, e.keep)
                ready[i] = _window_timeline(g, times, pinned, e.ends_window)
                del e
                out.append(times)
            return out

        def settle() -> None:
            """Measure each edit's window before the newest, now that the newest is replayed and its graph gone:
            with the graph still held, what-if over 1,024 copies of a real rank peaked at 2,071 MiB, now 1,847."""
            for i, done in enumerate(ready):
                if pending[i] is not None:
                    measure(i, done)
                pending[i], ready[i] = done, None

        self.run.walk(self.statistics, {}, replay, edges=True, replays=len(edits), stop=stop, after=settle)
        for i in range(len(edits)):
            if pending[i] is not None:
                measure(i, None)
        self.tallied |= tally
        return ([pl.concat(p).sort("step", "rank") if p else pl.DataFrame() for p in parts],
                segments[0] if segments else None)


def _window_of(spans: list[tuple[int, int]], step: int) -> int:
    return next((i for i, (a, b) in enumerate(spans) if a <= step <= b), len(spans) - 1)


def _wanted(window: tuple[pl.DataFrame, np.ndarray, pl.DataFrame], steps: list[int] | None) -> bool:
    """Whether a window is measured: every window (``steps`` None), or one holding one of ``steps``."""
    return steps is None or window[2]["step"].is_in(steps).any()


def _add_counts(total: dict[str, int], counts: dict[str, int]) -> None:
    """Add a window's edge counts to ``total`` in place, a key new to it placed after the key before it in
    ``counts``: each window's keys come in the whole graph's order, so the total's do too."""
    keys = list(total)
    for i, (key, value) in enumerate(counts.items()):
        if key not in total:
            after = next((keys.index(k) + 1 for k in reversed(list(counts)[:i]) if k in keys), 0)
            keys.insert(after, key)
        total[key] = total.get(key, 0) + value
    ordered = {k: total[k] for k in keys}
    total.clear()
    total.update(ordered)


def _quantile(samples: list[tuple[np.ndarray, ...]], size: int, name: str) -> np.ndarray:
    """A per-rank statistic of :data:`~traceana.model.graph.STATISTICS` over every window's samples."""
    rank = np.concatenate([r for r, _ in samples]) if samples else np.zeros(0, np.int64)
    value = np.concatenate([v for _, v in samples]) if samples else np.zeros(0, np.int64)
    return dependency.per_rank_quantile(rank, value, size, dependency.STATISTICS[name])


def _spilled(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> tuple[Path, pl.Series]:
    """The run's events (EVENTS_SQL's rows, each name as its index in the run's names) written to ``path`` in step
    order, so that a window is read from its row groups; and the names."""
    params = {"run": run_id}
    with dependency.coded_names(con, params) as names:
        con.sql(f"SELECT * FROM ({EVENTS_SQL}) ORDER BY step, {', '.join(ORDER)}",
                params=params).write_parquet(str(path), row_group_size=100_000)
    return path, pl.Series("name", names.to_pylist(), pl.Categorical)  # as the whole graph's names (graph._events)


def _window_syncs(con: duckdb.DuckDBPyConnection, run_id: str, events: str, spans: list[tuple[int, int]]
                  ) -> pl.DataFrame:
    """The run's recorded synchronizations whose waited event is in a step, as graph.py reads them, with the window
    each belongs to: a stream wait's waiter's, any other's waited event's."""
    schema = {"rank": pl.Int32, "kind": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "waited_event_id": pl.Int64, "waiter_event_id": pl.Int64}
    if not _has_syncs(con):
        return pl.DataFrame(schema=schema | {"window": pl.Int64})
    frame = con.sql(f"""
        SELECT s.rank, s.kind, s.start_ns, s.end_ns, s.waited_event_id, s.waiter_event_id,
               CASE WHEN s.kind = 'stream_wait' AND w.step IS NOT NULL THEN w.step ELSE d.step END AS step
        FROM syncs s JOIN '{events}' d ON d.rank = s.rank AND d.event_id = s.waited_event_id
        LEFT JOIN '{events}' w ON s.waiter_event_id IS NOT NULL AND w.rank = s.rank
                               AND w.event_id = s.waiter_event_id
        WHERE s.run_id = $run""", params={"run": run_id}).pl().cast(schema)
    firsts = np.array([a for a, _ in spans])
    return frame.with_columns(window=pl.Series(np.searchsorted(firsts, frame["step"].to_numpy(), "right") - 1)
                              ).drop("step")


def cuts(con: duckdb.DuckDBPyConnection, run_id: str, events: str, window_events: int) -> list[tuple[int, int]]:
    """The run's steps grouped into windows (first, last step) of about ``window_events`` events each, cut only
    where the module doc allows. ``events``: the Parquet file of the run's events (:func:`_spilled`)."""
    params = {"run": run_id}
    per_step = con.sql(f"SELECT step, count(*) AS n FROM '{events}' GROUP BY step ORDER BY step").fetchall()
    steps = [s for s, _ in per_step]
    if len(steps) < 2:
        return [(steps[0], steps[0])] if steps else []
    spans = []  # (from, to): no cut after any step from..to-1
    # a collective instance's members in more than one step
    spans += con.sql(f"SELECT min(step), max(step) FROM '{events}' WHERE instance IS NOT NULL "
                     "GROUP BY instance HAVING min(step) < max(step)").fetchall()
    # host points (launches; wait returns, at their waited event's step) of a later step before, or within
    # BARRIER_NS after, those of an earlier one, on a rank
    returns = (f"""UNION ALL SELECT s.rank, e.step, s.end_ns FROM syncs s JOIN '{events}' e
                   ON e.rank = s.rank AND e.event_id = s.waited_event_id
                   WHERE s.run_id = $run AND s.kind = 'host_wait'""" if _has_syncs(con) else "")
    points = con.sql(f"""
        WITH firsts AS (SELECT rank, min(start_ns) AS first_ns FROM step_windows WHERE run_id = $run GROUP BY rank),
        p AS (SELECT e.rank, e.step, e.launch_ns AS t FROM '{events}' e JOIN firsts f USING (rank)
              WHERE e.launch_ns IS NOT NULL AND e.start_ns >= f.first_ns {returns})
        SELECT rank, step, min(t) AS lo, max(t) AS hi FROM p GROUP BY rank, step ORDER BY rank, step""",
                     params=params).pl()
    spans += (points.with_columns(pl.col("hi").cum_max().over("rank").alias("before"),
                                  pl.col("lo").reverse().cum_min().reverse().shift(-1).over("rank").alias("after"),
                                  pl.col("step").shift(-1).over("rank").alias("next_step"))
              .filter(pl.col("after") <= pl.col("before") + BARRIER_NS).select("step", "next_step").rows())
    if _has_syncs(con):  # a stream wait whose waited event is in a later step than its waiter
        spans += con.sql(f"""
            SELECT w.step, d.step FROM syncs s
            JOIN '{events}' d ON d.rank = s.rank AND d.event_id = s.waited_event_id
            JOIN '{events}' w ON w.rank = s.rank AND w.event_id = s.waiter_event_id
            WHERE s.run_id = $run AND s.kind = 'stream_wait' AND d.step > w.step""", params=params).fetchall()
    at = np.array(steps)
    crossing = np.zeros(len(at) + 1, np.int64)  # a count of spans over each step's cut, by differences
    for lo, hi in spans:
        crossing[np.searchsorted(at, lo)] += 1
        crossing[np.searchsorted(at, hi)] -= 1
    blocked = np.cumsum(crossing)[:-1] > 0  # no cut after steps[i]
    windows, first, held = [], steps[0], 0
    for i, (step, n) in enumerate(per_step):
        held += n
        if held >= window_events and not blocked[i] and i + 1 < len(steps):
            windows.append((first, step))
            first, held = steps[i + 1], 0
    return [*windows, (first, steps[-1])]


def _has_syncs(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'syncs'")
                .fetchall()[0][0])
class _Run:
    """A run's events (the Parquet file of :func:`_spilled`), windows (``spans``: first, last step), step windows,
    streams carried over from before its first window, and syncs (with their window): walked window by window."""

    def __init__(self, run_id: str, events: Path, names: pl.Series, spans: list[tuple[int, int]],
                 windows: pl.DataFrame, carried: pl.DataFrame, syncs: pl.DataFrame) -> None:
        self.run_id, self.events, self.names, self.spans, self.windows, self.carried, self.syncs = (
            run_id, events, names, spans, windows, carried, syncs)
        self.firsts = windows.group_by("rank").agg(pl.col("start_ns").min()).sort("rank")
        # the run's process groups and the events launched where CUDA graphs do not reach, given to each window's
        # graph once set (Windows.for_changes)
        self.groups: pl.DataFrame | None = None
        self.uncapturable: pl.DataFrame | None = None

    def walk(self, statistics: dict[str, np.ndarray], samples: dict[str, list[tuple[np.ndarray, ...]]],
             visit: Callable[..., list[np.ndarray] | None] | None = None, edges: bool = False, replays: int = 0,
             stop: int | None = None, after: Callable[[], None] | None = None) -> None:
        """Build each window's graph (its own events and the earlier ones it needs, pinned) up to window ``stop``
        and give it to ``visit`` (the graph, its pinned rows; with ``replays``, also per replay the pinned nodes'
        times, and ``visit`` returns per replay each node's time, which the next windows' pinned rows keep), then
        call ``after`` with the window's graph let go. A window's arrays are let go before the next is read: with
        two windows' at once, a window of 3.2 M events peaked at 2.8 GiB."""
        past = None
        host = pl.DataFrame(schema={"rank": pl.Int32, "time_ns": pl.Int64, "step": pl.Int64,
                                    **{f"at_{i}": pl.Int64 for i in range(replays)}})
        for k, (a, b) in enumerate(self.spans[:None if stop is None else stop + 1]):
            own = pl.scan_parquet(self.events).filter(pl.col("step").is_between(a, b)).collect()
            own = own.with_columns(name=self.names.gather(own["name"]))  # codes of the run's names, as build's
            rows = (own if past is None else pl.concat([past, own], how="diagonal_relaxed")).sort(
                ORDER, nulls_last=True, maintain_order=True)
            del own
            earlier = "_pinned" in rows.columns
            pinned = rows["_pinned"].fill_null(False).to_numpy() if earlier else np.zeros(rows.height, bool)
            at = [np.concatenate([*(rows.filter(pl.Series(pinned))[f"at_{side}_{i}"].to_numpy()
                                    for side in ("start", "end") if earlier), host[f"at_{i}"].to_numpy()]
                                 ).astype(np.int64) for i in range(replays)]
            context = Context(pinned, host.select("rank", "time_ns", "step"), self.firsts, statistics, samples,
                              edges=edges)
            g = dependency.from_frames(self.run_id, rows.select(pl.exclude("^_pinned|at_.*$")),
                                       self.windows.filter(pl.col("step").is_between(a, b)),
                                       self.syncs.filter(pl.col("window") == k).drop("window"), self.carried, context)
            del context
            if self.groups is not None:  # what a what-if's changes read beside the events
                g.groups, g.uncapturable = self.groups, dependency.flagged(g.events, self.uncapturable)
            times = visit(g, pinned, at) if replays else visit(g, pinned) if visit is not None else None
            if k + 1 < len(self.spans):
                kept = self._kept(rows, k)
                n = rows.height
                past = rows[kept].select(pl.exclude("^_pinned|at_.*$")).with_columns(
                    _pinned=pl.lit(True), **{f"at_{side}_{i}": pl.Series(_at(t, n, side)[kept])
                                             for i, t in enumerate(times or []) for side in ("start", "end")})
                last = g.last_host if g.last_host is not None else pl.DataFrame(schema={"node": pl.Int64})
                nodes = last["node"].to_numpy() if last.height else np.zeros(0, np.int64)
                host = last.drop("node").with_columns(**{f"at_{i}": pl.Series(t[nodes], dtype=pl.Int64)
                                                         for i, t in enumerate(times or [])}).cast(host.schema)
            del g, times, rows, pinned, at
            if after is not None:
                after()

    def _kept(self, rows: pl.DataFrame, k: int) -> np.ndarray:
        """Of window ``k``'s rows, those the windows after it need (module doc), in row order."""
        rows = rows.select("rank", "stream", "start_ns", "end_ns", "event_id").with_row_index("r")
        a, b = self.spans[k + 1]
        next_ns = (self.windows.filter(pl.col("step").is_between(a, b)).group_by("rank")
                   .agg(pl.col("start_ns").min().alias("next_ns")))
        waited = (self.syncs.filter(pl.col("window") > k)
                  .select("rank", pl.col("waited_event_id").alias("event_id")).unique())
        keep = pl.concat([
            rows.group_by("rank", "stream").agg(pl.col("r").max()).select("r"),
            rows.filter(pl.col("end_ns") > pl.col("start_ns")).group_by("rank", "stream")
                .agg(pl.col("r").sort_by("end_ns", "r").last()).select("r"),
            rows.join(next_ns.cast({"rank": rows.schema["rank"]}), on="rank")
                .filter(pl.col("end_ns") >= pl.col("next_ns")).select("r"),
            rows.join(waited.cast({"rank": rows.schema["rank"]}), on=["rank", "event_id"], how="semi").select("r"),
        ]).unique()["r"].sort()
        return keep.to_numpy()


def _at(times: np.ndarray, n: int, side: str) -> np.ndarray:
    """The replayed start, or end (never before the start), of a graph's ``n`` event rows from its node times."""
    start = times[:n]
    return start if side == "start" else np.maximum(times[n:2 * n], start)


def _window_timeline(g: Graph, times: np.ndarray, pinned: np.ndarray, ends_window: np.ndarray | None = None
                     ) -> tuple[pl.DataFrame, np.ndarray, pl.DataFrame]:
    """(every row of a window's graph with its replayed times, which are pinned, its step windows with their own
    events' last replayed end (of those in ``ends_window``: replay.timeline) and first replayed start)."""
    n = g.n
    events = g.events.with_columns(start_ns=pl.Series(_at(times, n, "start")), end_ns=pl.Series(_at(times, n, "end")))
    own = events.select("rank", "step", "start_ns", "end_ns").filter(pl.Series(~pinned))
    ends = own if ends_window is None else own.filter(pl.Series(ends_window[~pinned]))
    last = ends.group_by("rank", "step").agg(pl.col("end_ns").max().alias("last_ns"))
    first = (own.filter(pl.Series(~g.straddles[~pinned])).group_by("rank", "step")
             .agg(pl.col("start_ns").min().alias("first_ns")))
    windows = g.windows.join(last, on=["rank", "step"], how="left").join(first, on=["rank", "step"], how="left")
    return events, pinned, windows


def _settled(window: tuple[pl.DataFrame, np.ndarray, pl.DataFrame],
             following: tuple[pl.DataFrame, np.ndarray, pl.DataFrame] | None, firsts: pl.DataFrame,
             overhang: pl.DataFrame | None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(the events that meet a replayed window, its step windows replayed, the events still running at its end):
    its steps end where the ``following`` window's start; its events are its graph's rows, the following window's
    that start by its end, and the ``overhang`` of the window before (what replayed past its end, which the window's
    graph need not hold: a change moves events across a measured boundary)."""
    events, _, windows = window
    both = windows if following is None else pl.concat([windows, following[2]], how="vertical_relaxed")
    both = both.join(firsts.rename({"start_ns": "run_first_ns"}), on="rank", how="left").sort("rank", "start_ns")
    steps = windows.select("rank", "step")
    final = replayed_windows(both, pl.col("start_ns") == pl.col("run_first_ns")).join(steps, on=["rank", "step"],
                                                                                      how="semi")
    span = final.group_by("rank").agg(pl.col("start_ns").min(), pl.col("end_ns").max())  # a window's steps: one span
    parts = [] if overhang is None else [overhang]
    parts.append(events)
    if following is not None:  # the next window's events that start by the window's end
        later, pinned, _ = following
        parts.append(later.filter(pl.Series(~pinned & meets(later, span))))
    events = pl.concat(parts, how="vertical_relaxed").unique(["rank", "event_id"], keep="first", maintain_order=True)
    ends = span.select("rank", pl.col("end_ns").alias("span_end_ns")).cast({"rank": events.schema["rank"]})
    end_of_span = events.select("rank").join(ends, on="rank", how="left", maintain_order="left")["span_end_ns"]
    running = (events["end_ns"] >= end_of_span).fill_null(False).to_numpy()
    return _with_partners(events, meets(events, span)), final, _with_partners(events, running)


def _with_partners(events: pl.DataFrame, chosen: np.ndarray) -> pl.DataFrame:
    """The ``chosen`` events and every other member of their collective instances: the views find an instance's
    last arriver among its members, wherever they replayed to."""
    instances = events.filter(pl.Series(chosen))["instance"].drop_nulls().unique()
    return events.filter(pl.Series(chosen) | pl.col("instance").is_in(instances.implode()).fill_null(False))


def _measured(events: pl.DataFrame, final: pl.DataFrame, ranks: pl.DataFrame, run_id: str, step: int | None,
              path_step: int | None) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """(a replayed window's breakdown per rank and step (or ``step``'s), measured as replay.simulate measures a
    run; the critical path segments of ``path_step`` where the window holds it)."""
    from traceana.analyses import critical_path

    with simulated_store([(run_id, events, final)], ranks) as sim:
        path = (critical_path.of_step(sim, run_id, path_step)[2]
                if path_step is not None and final["step"].is_in([path_step]).any() else None)
        return breakdown_of(sim, run_id, step), path
