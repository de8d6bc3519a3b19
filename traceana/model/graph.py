"""The dependency graph of a measured run (DESIGN §8): what each device event waited for, over all its steps.

Nodes are each device event's start S and end E, each launched event's host launch point H, each collective
instance's arrival A (its last member's start), each host wait's return R, one barrier B per step boundary where
the ranks' hosts left a barrier together, and one root per rank, its first step window's start W (the only
measured time a replay keeps). One graph spans the run, so a change in one step moves the steps after it, and a
transfer posted in one step (a Recv posted early) ends with its partner in the next. An edge ``u -> v`` of weight
``w`` says ``t(v) >= t(u) + w``; :mod:`traceana.model.replay` gives every node the earliest time its edges allow.
Edge kinds (``KINDS``):

- ``run``: S -> E, the event's measured length; a collective's member instead runs S -> A and A -> E, the
  transfer's measured length ``end - latest start`` (a member alone in the trace keeps its whole length).
- ``stream``: the previous event on the same stream, E -> S.
- ``launch``: H -> S, the rank's launch latency (the median ``start - launch_ns`` of events whose stream was free).
- ``host``: the rank's host points in time order (launches, wait returns), each after the previous by the measured
  gap: host time, kept as measured.
- ``host_wait``: a recorded synchronization (``syncs`` table): the host resumes when the event it waited for ends,
  after the measured return lag.
- ``stream_wait``: a recorded cross-stream wait (event record + stream wait): the waited event's E -> the waiter's S.
- ``inferred``: no record, but a launched event started late, right at another stream's event's end: that E -> S,
  with the rank's median lag between the two.
- ``gap``: an event with no launch record that starts after a gap nothing recorded explains (CPU-only and Ascend
  runs): from the event that ended last before it on the rank, the measured gap, a fixed delay. A replay reproduces
  these by construction; a what-if cannot shorten them. Their count is reported.
- ``external``: a launched event that sat more than a millisecond past everything the trace shows, the device idle
  with the work queued (a wait on something outside the trace: another process, an untraced event): like ``gap``, a
  fixed delay, counted and reported as ``external_hold_ms`` beside the replay.
- ``barrier``: the first launches of a step on every rank within ``BARRIER_NS`` of each other although the ranks
  got there (their previous host points) far apart: the hosts waited for each other (a barrier, a host-side
  collective); the step starts on every rank after the last one arrives, plus the host time of that last one.
- ``anchor``: W -> a rank's first host point or first event, or an event begun before the first window that runs
  into it, at its measured offset from the window start.

Everything is vectorized (DuckDB ASOF joins, NumPy); the graph of one step at 1,024 ranks builds in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import polars as pl

if TYPE_CHECKING:
    import pyarrow as pa

from traceana.errors import TraceanaError

KINDS = ("run", "transfer", "stream", "launch", "host", "host_wait", "stream_wait", "inferred", "gap", "external",
         "barrier", "anchor")
(RUN, TRANSFER, STREAM, LAUNCH, HOST, HOST_WAIT, STREAM_WAIT, INFERRED, GAP, EXTERNAL, BARRIER,
 ANCHOR) = range(len(KINDS))
SLACK_NS = 1_000            # a start later than every recorded constraint by more than this was held by something
INFER_WITHIN_NS = 20_000    # ... and an other-stream end at most this long before it is taken as what held it
EXTERNAL_NS = 1_000_000     # a launched event held this long past everything the trace shows waited on the outside
BARRIER_NS = 20_000         # ranks whose hosts start a step this close together, after arriving farther apart, met
CLOCK_NS = 2 ** 62          # times beyond +-this (a damaged store's -2^63 sentinel) would overflow the int64 arithmetic

# every device event in a step window (its step: the window it starts in), and those begun before a rank's first
# window that run into it (given the first step)
# the run's distinct event names: EVENTS_SQL gives each event's name as its index in these (:func:`_events`, which
# registers them as ``event_names``)
NAMES_SQL = "SELECT DISTINCT name FROM device_events WHERE run_id = $run AND name IS NOT NULL"
EVENTS_SQL = """
WITH first AS (SELECT rank, min(start_ns) AS first_ns, arg_min(step, start_ns) AS first_step
               FROM step_windows WHERE run_id = $run GROUP BY rank)
SELECT e.rank, e.event_id, e.stream, e.start_ns, e.end_ns, n.name_id AS name, e.category, e.launch_ns,
       c.op, c.dim, c.pg, c.instance, c.peer, coalesce(w.step, f.first_step) AS step
FROM device_events e
JOIN first f ON f.rank = e.rank
LEFT JOIN event_names n ON n.name = e.name
LEFT JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns
                         AND e.start_ns < w.end_ns
LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
WHERE e.run_id = $run AND (w.step IS NOT NULL OR (e.start_ns < f.first_ns AND e.end_ns >= f.first_ns))
ORDER BY e.rank, e.stream, e.start_ns, e.end_ns, e.event_id
"""

# EVENTS_SQL's text columns of a few distinct values, held as categoricals (:func:`_events`)
CODED = ("category", "op", "dim", "pg")

# each stream's last end before a rank's first window: what held the stream until then
CARRIED_SQL = """
SELECT e.rank, e.stream, max(e.end_ns) AS busy_until_ns
FROM device_events e
JOIN (SELECT rank, min(start_ns) AS first_ns FROM step_windows WHERE run_id = $run GROUP BY rank) f
  ON f.rank = e.rank AND e.end_ns < f.first_ns
WHERE e.run_id = $run
GROUP BY ALL
"""


@dataclass
class Graph:
    """A run's graph. ``events`` row i (with its step) is nodes S = i and E = n + i; ``windows`` has one row per rank
    and step (rank, step, start_ns, end_ns; tail_ns: the measured time from the last end of the step's events on the
    rank to its window's end; lead_ns: from the window's start to its first event's, NULL without one;
    held_ns: how long launched events sat past every recorded and inferred constraint by less than EXTERNAL_NS, what
    the graph cannot explain and a replay therefore leaves out; external_ns: the longer holds, kept as fixed delays)."""

    run_id: str
    events: pl.DataFrame
    windows: pl.DataFrame
    n_nodes: int
    src: np.ndarray            # edges, sorted by source node
    dst: np.ndarray
    weight: np.ndarray
    kind: np.ndarray
    event: np.ndarray          # the event whose length an edge carries (run, transfer), else -1
    roots: np.ndarray          # W nodes
    root_ns: np.ndarray        # their measured times
    straddles: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # started in the step before
    counts: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    # per event: launched inside a host region CUDA graphs do not capture (:data:`UNCAPTURABLE`); empty: none known
    uncapturable: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # the run's process groups (pg, ranks: a list), which the events name by pg
    groups: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"pg": pl.String,
                                                                            "ranks": pl.List(pl.Int32)}))
    facts: dict[str, int] = field(default_factory=dict)  # what missing_notes reads, summed over a run's windows
    last_host: pl.DataFrame | None = None  # a graph of some steps: each rank's last host point (_host_chain)
    # nodes whose times are given (a graph of some steps: its earlier events' starts, their ends, the host points
    # before the steps) and those times
    pinned: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pinned_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n(self) -> int:
        return self.events.height


# the per-rank statistics the weights use, each a quantile of what the events show (:func:`_statistic`)
STATISTICS = {"launch": 0.5, "least launch": 0.0, "spacing": 0.25, "lag": 0.5}


@dataclass
class Context:
    """What the graph of some of a run's steps (replay.Windows) takes from the steps before them, so that its nodes get
    the times the run's whole graph gives them: the rows of its events that are earlier events (``pinned``, kept for
    the edges they send; their own edges belong to their steps' graph), each rank's last host point before the
    steps (``host``: rank, time_ns as measured, step), each rank's first window start in the run (``firsts``: rank,
    start_ns), and the per-rank statistics of :data:`STATISTICS` over the whole run (``statistics``, each an array
    by rank); a statistic not given yet is measured on the graph's own events and its samples added to ``samples``,
    for the caller to take over all the run's steps."""

    pinned: np.ndarray
    host: pl.DataFrame
    firsts: pl.DataFrame
    statistics: dict[str, np.ndarray] = field(default_factory=dict)
    samples: dict[str, list[tuple[np.ndarray, ...]]] = field(default_factory=dict)
    edges: bool = True  # False: a pass for the samples and what the next steps need, whose edges are not kept


def _statistic(context: Context | None, name: str, rank: np.ndarray, value: np.ndarray, size: int) -> np.ndarray:
    """The run's per-rank statistic ``name`` (:data:`STATISTICS`): from the context where it has it, else measured
    on these samples (and they are kept in the context for the caller)."""
    if context is not None:
        if name in context.statistics:
            return context.statistics[name]
        context.samples.setdefault(name, []).append(_kept_samples(rank, value, STATISTICS[name]))
    return per_rank_quantile(rank, value, size, STATISTICS[name])


def _kept_samples(rank: np.ndarray, value: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """Of some steps' samples, what the run's ``q`` quantile needs: the least of each rank's (the least of the
    leasts is the run's) for q = 0, else every sample, its rank as int32 (the 19 M samples of 1,024 copies of a real
    rank took 0.3 GiB as int64 pairs, the least launch's 9.7 M of them)."""
    if q == 0.0:
        least = pl.DataFrame({"rank": rank, "v": value}).group_by("rank").agg(pl.col("v").min())
        return least["rank"].to_numpy(), least["v"].to_numpy()
    return rank.astype(np.int32), value


class _Edges:
    """Edge arrays collected part by part, one list of parts per column (src, dst, weight, kind, event), so that
    :meth:`arrays` lets each column's parts go as it joins them: the parts and all five joined columns at once were
    the graph's peak (21 M edges at 1,024 synthesized ranks). Node and event numbers are int32 where the nodes
    fit (21 bytes an edge, 33 with int64). A graph's edges are sorted by source node (:attr:`Graph.src`), so the
    longest path needs no sort of its own per replay."""

    def __init__(self, nodes: int, kept: bool = True) -> None:
        self.columns: tuple[list[np.ndarray], ...] = ([], [], [], [], [])
        self.node_type = np.int32 if nodes < 2 ** 31 else np.int64
        self.kept = kept  # False: none are kept (a pass that measures statistics only)

    def add(self, kind: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | int,
            event: np.ndarray | None = None) -> None:
        if not self.kept:
            return
        node = self.node_type
        src = np.asarray(src, node)
        parts = (src, np.asarray(dst, node), np.broadcast_to(np.asarray(weight, np.int64), src.shape),
                 np.full(src.shape, kind, np.int8),
                 np.full(src.shape, -1, node) if event is None else np.asarray(event, node))
        for column, part in zip(self.columns, parts, strict=True):
            column.append(part)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The columns, edges in order of their source node (stable): the order the longest path walks them in."""
        if not self.kept:
            return tuple(np.zeros(0, t) for t in (self.node_type, self.node_type, np.int64, np.int8, self.node_type))
        joined = []
        for column in self.columns:
            joined.append(np.concatenate(column))
            column.clear()
            if len(joined) == 1:
                order = np.argsort(joined[0], kind="stable")
            joined[-1] = joined[-1][order]
        return tuple(joined)


def build(con: duckdb.DuckDBPyConnection, run_id: str) -> Graph:
    """The graph of ``run_id`` from the store (see the module doc)."""
    params = {"run": run_id}
    events = _events(con, params)
    windows = con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = $run "
                      "ORDER BY rank, start_ns", params=params).pl()
    g = from_frames(run_id, events, windows, _syncs(con, run_id, events), con.sql(CARRIED_SQL, params=params).pl())
    g.uncapturable = flagged(events, uncapturable(con, run_id))
    g.groups = groups(con, run_id)
    return g


def _events(con: duckdb.DuckDBPyConnection, params: dict) -> pl.DataFrame:
    """EVENTS_SQL's rows, each event's name a categorical of the run's distinct names: as text, 4.9M events of
    1,024 synthesized ranks held 785 MiB of names (a 1.2 GiB frame; DuckDB's 1 GiB for a dataset reader could not
    sort them), as codes 19 MiB. The few-valued text columns (:data:`CODED`) are categoricals too: as text they
    were copied on the way into polars (9.7 M events of 1,024 copies of a real rank: 1.9 GiB for a frame of 0.8)."""
    import pyarrow as pa

    with coded_names(con, params) as names:
        table = con.sql(EVENTS_SQL, params=params).arrow().read_all()
    table = table.set_column(table.schema.get_field_index("name"), "name",
                             pa.DictionaryArray.from_arrays(table["name"].combine_chunks(), names))
    for column in CODED:
        table = table.set_column(table.schema.get_field_index(column), column, table[column].dictionary_encode())
    # in one chunk: DuckDB's batches (79 at 9.7 M events) made every frame that joins them with the replayed times
    # (one chunk each) a copy of all their columns (+0.55 GiB a what-if or replay)
    return pl.from_arrow(table).rechunk()


@contextmanager
def coded_names(con: duckdb.DuckDBPyConnection, params: dict) -> Iterator[pa.Array]:
    """The run's distinct event names, registered as ``event_names`` (name, name_id: its index in them) while the
    block runs, for EVENTS_SQL."""
    import pyarrow as pa

    names = con.sql(NAMES_SQL, params=params).arrow().read_all()["name"].combine_chunks()
    con.register("event_names", pa.table({"name": names, "name_id": pa.array(range(len(names)), pa.uint32())}))
    try:
        yield names
    finally:
        con.unregister("event_names")


# host regions a CUDA graph of the steady forward / backward leaves out (Kineto's own annotations): the optimizer
# step and zero_grad, and data loading
UNCAPTURABLE = ("Optimizer.%", "enumerate(DataLoader%")


def groups(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """The run's process groups (pg, ranks), which events name by pg."""
    return con.sql("SELECT pg, ranks FROM process_groups WHERE run_id = $run", params={"run": run_id}).pl()


def uncapturable(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame | None:
    """The events (rank, event_id) whose launch lies in a host annotation of :data:`UNCAPTURABLE` on its rank (one
    range join in the store, not a pass over the events per annotation); None for a store before annotations."""
    like = " OR ".join(f"a.name LIKE '{p}'" for p in UNCAPTURABLE)
    try:
        return con.sql(f"""
            SELECT DISTINCT e.rank, e.event_id FROM device_events e
            JOIN annotations a ON a.run_id = e.run_id AND a.rank = e.rank
                              AND e.launch_ns BETWEEN a.start_ns AND a.end_ns
            WHERE e.run_id = $run AND a.domain = 'cpu' AND a.kind = 'user_annotation' AND ({like})""",
                       params={"run": run_id}).pl()
    except duckdb.CatalogException:  # a store written before the annotations table
        return None


def flagged(events: pl.DataFrame, inside: pl.DataFrame | None) -> np.ndarray:
    """Per event, whether it is among ``inside`` (rank, event_id; None: none)."""
    if inside is None:
        return np.zeros(events.height, bool)
    key = pl.struct("rank", "event_id")
    return events.select(key.is_in(inside.select(key)[:, 0].implode())).to_series().to_numpy()


def lone_members(graph: Graph, own: np.ndarray) -> pl.DataFrame:
    """The collective kernels among ``own`` (a mask of the graph's events) with no other member in the trace
    (rank, name, step, ns: their measured length): one rank of a larger job."""
    ev = graph.events.filter(pl.Series(own) & pl.col("instance").is_not_null())
    return (ev.with_columns(pl.len().over("instance").alias("members"),
                            (pl.col("end_ns") - pl.col("start_ns")).alias("ns"))
            .filter(pl.col("members") == 1).select("rank", "name", "step", "ns"))


def capturable_host_edges(graph: Graph) -> np.ndarray:
    """Per edge, whether it is host time a CUDA graph removes: a ``host`` edge from one launch to the next of the
    same step, neither launched inside an uncapturable region (:data:`UNCAPTURABLE`). The host time before a
    step's first launch (data loading), around a synchronization (a wait return is a host point of its own) and
    in the optimizer stays."""
    ev = graph.events
    launched = ~ev["launch_ns"].is_null().to_numpy()
    if len(graph.straddles):
        launched &= ~graph.straddles
    launched[graph.pinned[graph.pinned < graph.n]] = False  # a graph of some steps: its earlier events' H are not here
    event_of = np.full(graph.n_nodes, -1, np.int64)
    event_of[2 * graph.n + np.arange(int(launched.sum()))] = np.flatnonzero(launched)
    host = np.flatnonzero(graph.kind == HOST)  # looked up for these only: two int64 arrays per edge were 0.6 GiB
    src, dst = event_of[graph.src[host]], event_of[graph.dst[host]]
    both = (src >= 0) & (dst >= 0)  # between two launches, not a wait return
    host, s, d = host[both], src[both], dst[both]
    step = ev["step"].to_numpy()
    blocked = graph.uncapturable if len(graph.uncapturable) else np.zeros(graph.n, bool)
    out = np.zeros(len(graph.kind), bool)
    out[host] = (step[s] == step[d]) & ~blocked[s] & ~blocked[d]
    return out


def _syncs(con: duckdb.DuckDBPyConnection, run_id: str, events: pl.DataFrame) -> pl.DataFrame:
    """The run's recorded synchronizations whose waited event is among ``events`` (none on a store written before
    the syncs table existed)."""
    empty = pl.DataFrame(schema={"rank": pl.Int32, "kind": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                 "waited_event_id": pl.Int64, "waiter_event_id": pl.Int64})
    has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'syncs'").fetchall()[0][0]
    if not has or events.is_empty():
        return empty
    keys = events.select("rank", "event_id")  # noqa: F841 - read by the query below
    return con.sql("SELECT s.rank, s.kind, s.start_ns, s.end_ns, s.waited_event_id, s.waiter_event_id FROM syncs s "
                   "SEMI JOIN keys k ON k.rank = s.rank AND k.event_id = s.waited_event_id "
                   "WHERE s.run_id = $run", params={"run": run_id}).pl().cast(empty.schema)


def from_frames(run_id: str, events: pl.DataFrame, windows: pl.DataFrame, syncs: pl.DataFrame,
                carried: pl.DataFrame, context: Context | None = None) -> Graph:
    """The graph from a run's events (sorted by rank, stream, start; with their step), step windows, syncs and the
    times each stream was held until before the rank's first window (rank, stream, busy_until_ns); with
    ``context``, the graph of some of the run's steps (:class:`Context`)."""
    graph, edges = _collected(run_id, events, windows, syncs, carried, context)
    # sorted once the arrays per event made on the way are gone: with them, the sort was the graph's peak
    graph.src, graph.dst, graph.weight, graph.kind, graph.event = edges.arrays()
    if context is not None:  # the pinned nodes' times are given: what the graph says of them is their window's
        is_pinned = np.zeros(graph.n_nodes, bool)
        is_pinned[graph.pinned] = True
        keep = ~is_pinned[graph.dst]
        graph.src, graph.dst, graph.weight, graph.kind, graph.event = (
            a[keep] for a in (graph.src, graph.dst, graph.weight, graph.kind, graph.event))
    return graph


def _collected(run_id: str, events: pl.DataFrame, windows: pl.DataFrame, syncs: pl.DataFrame,
               carried: pl.DataFrame, context: Context | None) -> tuple[Graph, _Edges]:
    """:func:`from_frames`' graph without its edge arrays, and its edges as collected. Every mask of events that
    gets an edge is of the graph's own events (not pinned by ``context``): a pinned event is there for the edges
    it sends."""
    n = events.height
    own = np.ones(n, bool) if context is None else ~context.pinned
    rank = events["rank"].to_numpy().astype(np.int64)
    stream = events["stream"].fill_null(-1).to_numpy()
    start = events["start_ns"].to_numpy()
    end = events["end_ns"].to_numpy()
    launch = events["launch_ns"].fill_null(0).to_numpy()  # int64: with its nulls a float64, off by up to 128 ns
    if n and (min(start.min(), end.min(), launch.min()) <= -CLOCK_NS
              or max(start.max(), end.max(), launch.max()) > CLOCK_NS):
        raise TraceanaError(f"run {run_id!r}: device event times beyond +-2^62 ns (a sentinel such as -2^63 in a "
                            "damaged store?): the run cannot be replayed")
    firsts = (windows.group_by("rank").agg(pl.col("start_ns").min()) if context is None else context.firsts
              ).sort("rank")
    ranks = firsts["rank"].to_numpy().astype(np.int64)
    rank_row = np.full(int(max(ranks.max(initial=0), rank.max(initial=0))) + 1, -1, np.int64)
    rank_row[ranks] = np.arange(len(ranks))
    first_ns = firsts["start_ns"].to_numpy()
    ws = first_ns[rank_row[rank]] if n else np.zeros(0, np.int64)  # each event's rank's root
    straddles = start < ws
    launched = ~events["launch_ns"].is_null().to_numpy() & ~straddles & own  # not launched before the trace's steps
    member = ~events["instance"].is_null().to_numpy() & own
    window_of = _window_rows(rank, events["step"].to_numpy(), windows)
    counts: dict[str, int] = {}
    # (an array per event costs 74 MiB at 9.7 M events: rows are taken as np.flatnonzero(mask), not from an index
    # array, and the arrays of what held a start dropped once their edges are made)

    # node numbering: S = i, E = n + i, then H per launched event, A per instance, R per host wait, W per rank
    h_nodes = 2 * n + np.arange(int(launched.sum()))  # the H of each launched event, in row order
    inst_values, inst_of = (np.unique(events["instance"].filter(pl.Series(member)).to_numpy(), return_inverse=True)
                            if member.any() else (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    a_base = 2 * n + len(h_nodes)
    r_base = a_base + len(inst_values)
    w_base = r_base + syncs.height
    b_base = w_base + len(ranks)
    c_base = b_base + windows["step"].n_unique()  # then, in a graph of some steps, each rank's last host point
    n_nodes = c_base + (0 if context is None else context.host.height)
    edges = _Edges(n_nodes, context is None or context.edges)

    # run and transfer
    solo = np.flatnonzero(~member & own)
    edges.add(RUN, solo, n + solo, end[solo] - start[solo], solo)
    del solo
    m = np.flatnonzero(member)
    a_node = a_base + inst_of
    latest = np.full(len(inst_values), np.iinfo(np.int64).min)
    np.maximum.at(latest, inst_of, start[m])
    edges.add(RUN, m, a_node, 0)
    edges.add(TRANSFER, a_node, n + m, np.maximum(0, end[m] - latest[inst_of]), m)
    counts["collective members"] = len(m)
    alone = np.bincount(inst_of, minlength=len(inst_values))[inst_of] == 1 if len(m) else np.zeros(0, bool)
    facts = {"alone": int(alone.sum()), "events": int(own.sum()), "launched": int(launched.sum()),
             "syncs": syncs.height}

    # stream order (events are sorted by rank, stream, start)
    same = np.zeros(n, bool)
    same[1:] = (rank[1:] == rank[:-1]) & (stream[1:] == stream[:-1])
    prev = np.where(same, np.arange(-1, n - 1), -1)
    del same
    has_prev = prev >= 0
    touching = has_prev & (end[np.maximum(prev, 0)] <= start + SLACK_NS) & own
    overlap = has_prev & ~touching & own
    edges.add(STREAM, prev[overlap], np.flatnonzero(overlap), 0)  # overlapping ones on a stream keep their order
    counts["overlapping on a stream"] = int(overlap.sum())
    counts["launch"] = int(launched.sum())  # its edges below, once the latency is known

    # the first event of a stream in the step follows the step before on that stream
    heads = np.flatnonzero(~has_prev & own)  # joined alone: a join of every event took 0.9 GiB at 9.7 M events
    found_busy = (events[["rank", "stream"]][heads].with_row_index("i")
                  .join(carried, on=["rank", "stream"], how="inner").drop_nulls("busy_until_ns")
                  .sort("i"))  # in row order, as the edges of every other kind
    f_rows = heads[found_busy["i"].to_numpy()]
    f_busy = found_busy["busy_until_ns"].to_numpy()
    follows = np.zeros(n, bool)
    follows[f_rows] = True
    edges.add(ANCHOR, w_base + rank_row[rank[f_rows]], f_rows, f_busy - ws[f_rows])
    counts["carried over"] = len(f_rows)

    # recorded cross-stream waits; then the host chains: launches and wait returns of each rank in time order
    # (built before the arrays below exist: with them, the chain's sort was the graph's peak)
    row_of = _row_lookup(events)
    stream_waits = syncs.filter(pl.col("kind") == "stream_wait", pl.col("waiter_event_id").is_not_null())
    waited = row_of(stream_waits["rank"], stream_waits["waited_event_id"])
    waiter = row_of(stream_waits["rank"], stream_waits["waiter_event_id"])
    ok = (waited >= 0) & (waiter >= 0)
    waited, waiter = waited[ok], waiter[ok]
    waited, waiter = waited[own[waiter]], waiter[own[waiter]]
    edges.add(STREAM_WAIT, n + waited, waiter, 0)
    if stream_waits.height:
        counts["stream_wait"] = len(waiter)
    last_host = _host_chain(edges, counts, n, (launched, rank, launch, h_nodes), events["step"].to_numpy(),
                syncs.filter(pl.col("kind") == "host_wait"), row_of, end, r_base, w_base + rank_row,
                first_ns[rank_row], b_base, None if context is None else (context.host, c_base))
    del row_of

    # the event that ended last before each start, in the step or (carried over) on a stream of the step before,
    # whose end then comes from the rank's root: what held a start that nothing recorded explains
    c_rank = carried["rank"].to_numpy().astype(np.int64)
    c_end = carried["busy_until_ns"].to_numpy()
    end_all = np.concatenate([end, c_end])
    stream_all = np.concatenate([stream, carried["stream"].fill_null(-1).to_numpy()])
    node_all = np.concatenate([np.arange(n, 2 * n), w_base + rank_row[c_rank]])
    offset_all = np.concatenate([np.zeros(n, np.int64), c_end - first_ns[rank_row[c_rank]]])
    other = _latest_end_before(rank, start, np.concatenate([rank, c_rank]), end_all, np.concatenate([start, c_end - 1]))
    found = other >= 0
    o = np.maximum(other, 0)
    del other

    # per rank: the launch latency, the median start - launch of kernels launched after their stream ran dry, with
    # nothing else on the rank ending between launch and start (where none was, the least start - launch: a bound
    # no start undercuts); and the device's own gap between a kernel and the next one already queued behind it on
    # its stream, where nothing else ended in between
    dry = launched & has_prev & (launch > end[np.maximum(prev, 0)]) & (~found | (end_all[o] <= launch))
    queued = touching & launched & (launch < end[np.maximum(prev, 0)]) & (end_all[o] <= end[np.maximum(prev, 0)])
    lat, spacing = rank_delays({
        "launch": _statistic(context, "launch", rank[dry], (start - launch)[dry], len(rank_row)),
        "least launch": _statistic(context, "least launch", rank[launched], (start - launch)[launched], len(rank_row)),
        "spacing": _statistic(context, "spacing", rank[queued], (start - end[prev])[queued], len(rank_row))})
    edges.add(LAUNCH, h_nodes, np.flatnonzero(launched), lat[rank[launched]])
    edges.add(STREAM, n + prev[touching], np.flatnonzero(touching),
              np.where(launched[touching], spacing[rank[touching]], 0))

    # measured readiness from what is recorded, to find what the records leave unexplained: what the stream, the
    # carried-over streams and the recorded waits say, then the rank's delays on top
    recorded = np.full(n, np.iinfo(np.int64).min)
    recorded[f_rows] = f_busy
    recorded[touching] = end[prev[touching]]
    waits = np.full(n, np.iinfo(np.int64).min)
    np.maximum.at(waits, waiter, end[waited])
    ready = _ready(rank, recorded, touching & launched, launched, launch, waits, lat, spacing)

    held = (start > ready + SLACK_NS) & ~straddles & own
    cross = held & found & (stream_all[o] != stream) & (end_all[o] > ready)
    inferable = launched & found & (stream_all[o] != stream) & (start - end_all[o] <= INFER_WITHIN_NS)
    infer = cross & inferable
    if context is not None and "lag" not in context.statistics:
        # the statistics' pass: the run's delays, so what counts as held, are not known yet; keep what decides it
        # (replay.Windows takes the lag from these: this window's own samples of it would be thrown away)
        c = np.flatnonzero(inferable)
        context.samples.setdefault("lag candidates", []).append(
            (rank[c].astype(np.int32), start[c], end_all[o[c]], recorded[c], touching[c], launch[c], waits[c]))
        del c
        lag = per_rank_quantile(rank[infer], (start - end_all[o])[infer], len(rank_row), STATISTICS["lag"])
    else:
        lag = _statistic(context, "lag", rank[infer], (start - end_all[o])[infer], len(rank_row))
    lag = np.maximum(lag, 0)
    edges.add(INFERRED, node_all[o[infer]], np.flatnonzero(infer), offset_all[o[infer]] + lag[rank[infer]])
    counts["inferred"] = int(infer.sum())
    unexplained = held & launched & ~infer
    external = unexplained & (start - ready > EXTERNAL_NS)
    unexplained &= ~external
    counts["unexplained"] = int(unexplained.sum())
    hold = (window_of[unexplained], start[unexplained] - ready[unexplained])  # (window, ns) of each
    e_from = external & found
    edges.add(EXTERNAL, node_all[o[e_from]], np.flatnonzero(e_from),
              start[e_from] - end_all[o[e_from]] + offset_all[o[e_from]])
    e_root = external & ~found
    edges.add(EXTERNAL, w_base + rank_row[rank[e_root]], np.flatnonzero(e_root), start[e_root] - ws[e_root])
    counts["external"] = int(external.sum())
    outside = (window_of[external], start[external] - ready[external])
    del ready
    gap = held & ~launched & (cross | touching)
    g_node = np.where(cross, node_all[o], n + np.maximum(prev, 0))[gap]
    g_end = np.where(cross, end_all[o], end[np.maximum(prev, 0)])[gap]
    edges.add(GAP, g_node, np.flatnonzero(gap), start[gap] - g_end + np.where(cross, offset_all[o], 0)[gap])
    counts["gap"] = int(gap.sum())
    anchored = (straddles | (~launched & ~cross & ~touching & (held | ~(has_prev | follows)))) & own
    edges.add(ANCHOR, w_base + rank_row[rank[anchored]], np.flatnonzero(anchored), start[anchored] - ws[anchored])
    counts["anchor"] = int(anchored.sum())

    rows = windows.height
    last_end = np.full(rows, np.iinfo(np.int64).min)
    first_start = np.full(rows, np.iinfo(np.int64).max)
    held_ns, external_ns = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    if n:
        np.maximum.at(last_end, window_of[own], end[own])
        np.minimum.at(first_start, window_of[~straddles & own], start[~straddles & own])
        np.add.at(held_ns, *hold)
        np.add.at(external_ns, *outside)
    has = last_end > np.iinfo(np.int64).min
    starts = first_start < np.iinfo(np.int64).max
    windows = windows.with_columns(tail_ns=pl.Series(np.where(has, windows["end_ns"].to_numpy() - last_end, 0)),
                                   lead_ns=pl.Series(first_start - windows["start_ns"].to_numpy()).set(
                                       pl.Series(~starts), None),
                                   held_ns=pl.Series(held_ns),
                                   external_ns=pl.Series(external_ns))
    facts["external"] = int(external.sum())
    none = np.zeros(0, np.int64)
    graph = Graph(run_id, events, windows, n_nodes, none, none, none, none, none, w_base + np.arange(len(ranks)),
                  first_ns, straddles, counts, missing_notes(facts), facts=facts)
    if context is not None:
        pinned = np.flatnonzero(context.pinned)
        graph.pinned = np.concatenate([pinned, n + pinned, c_base + np.arange(context.host.height)])
        graph.last_host = last_host  # the caller gives the pinned nodes their times (pinned_ns) before a replay
    return graph, edges


def missing_notes(facts: dict[str, int]) -> list[str]:
    """What a graph of these ``facts`` (events, launched ones, syncs, lone collective members, external holds)
    cannot model, one line each."""
    notes = []
    if facts["alone"]:
        notes.append(f"{facts['alone']} collective kernels have no other member in the trace (one rank of a "
                     "larger job?): their measured length, waits included, is kept as the transfer")
    if facts["events"] and not facts["launched"]:
        notes.append("no launch records (CPU-only or Ascend run): stream gaps that no recorded wait explains are "
                     "replayed as measured fixed delays ('gap' edges), which a what-if cannot shorten")
    if facts["events"] and not facts["syncs"]:
        notes.append("no recorded synchronizations (syncs table empty or absent): host waits are not modeled, "
                     "cross-stream waits are inferred from timing")
    if facts["external"]:
        notes.append(f"{facts['external']} launched events sat more than {EXTERNAL_NS / 1e6:g} ms past everything "
                     "the trace shows (device idle with the work queued: a wait on something outside the trace); "
                     "replayed as measured fixed delays ('external' edges, external_hold_ms)")
    return notes


def _window_rows(rank: np.ndarray, step: np.ndarray, windows: pl.DataFrame) -> np.ndarray:
    """Each event's row in ``windows`` (by its rank and step), -1 where none: a binary search in the windows'
    (rank, step) keys, not a join of every event (0.5 GiB at 9.7 M events)."""
    w_rank, w_step = windows["rank"].to_numpy().astype(np.int64), windows["step"].to_numpy().astype(np.int64)
    low = min(int(w_step.min(initial=0)), int(step.min(initial=0)))
    span = max(int(w_step.max(initial=0)), int(step.max(initial=0))) - low + 1
    keys = w_rank * span + (w_step - low)
    if not len(keys):
        return np.full(len(rank), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    wanted = rank * span + (step.astype(np.int64) - low)
    row = order[np.minimum(np.searchsorted(keys, wanted, sorter=order), len(keys) - 1)]
    return np.where(keys[row] == wanted, row, -1)


def _host_chain(edges: _Edges, counts: dict[str, int], n: int, launches: tuple[np.ndarray, ...], step: np.ndarray,
                host_waits: pl.DataFrame, row_of, end: np.ndarray, r_base: int, w_of_rank: np.ndarray,
                root_of_rank: np.ndarray, b_base: int, before: tuple[pl.DataFrame, int] | None
                ) -> pl.DataFrame | None:
    """Chain each rank's host points (``launches``: which events were launched, each event's rank and launch time,
    the launched ones' H nodes; wait returns) in time order with their measured gaps; a wait's return also follows
    the end of the event it waited for; and a step the hosts started together follows a barrier (module doc).
    ``step``: each event's step. The points' arrays are built here and sorted one at a time: copies of the
    launches' columns passed in, and the points' before and after sorting, were the graph's peak (+1.1 GiB at
    9.7 M events). ``before``: each rank's last host point before the graph's steps (:class:`Context`) and the
    first of their nodes, whose times are given: a rank's first point here follows it; then the chain's last point
    of each rank (rank, time_ns, step, node) is returned, for the next steps' graph."""
    launched, rank, launch, h_nodes = launches
    earlier = pl.DataFrame(schema={"rank": pl.Int32, "time_ns": pl.Int64, "step": pl.Int64}) if before is None \
        else before[0]
    e_node = np.arange(earlier.height) + (0 if before is None else before[1])
    waited = row_of(host_waits["rank"], host_waits["waited_event_id"])
    ok = waited >= 0
    w_start, w_end = host_waits["start_ns"].to_numpy()[ok], host_waits["end_ns"].to_numpy()[ok]
    w_rank = host_waits["rank"].to_numpy().astype(np.int64)[ok]
    w_event = waited[ok]
    blocked = end[w_event] > w_start
    r_node = r_base + np.flatnonzero(ok)
    # a point is reached from the previous one after (its time - previous time); a blocked return after
    # (call start - previous time) only: the rest of the call was the wait
    n_launched, n_returns = len(h_nodes), len(r_node)
    p_rank = np.concatenate([rank[launched].astype(np.int32), w_rank.astype(np.int32),
                             earlier["rank"].to_numpy().astype(np.int32)])
    p_time = np.concatenate([launch[launched], w_end, earlier["time_ns"].to_numpy()])
    order = np.lexsort((p_time, p_rank))
    p_rank, p_time = p_rank[order], p_time[order]
    p_node = np.concatenate([h_nodes, r_node, e_node]).astype(edges.node_type)[order]
    p_step = np.concatenate([step[launched], step[w_event], earlier["step"].to_numpy()])[order]
    p_launch = order < n_launched
    p_own = p_time.copy()  # a launch's own time is its time; a wait return's, the call's start where it blocked
    returns = np.flatnonzero(~p_launch & (order < n_launched + n_returns))
    p_own[returns] = np.where(blocked, w_start, w_end)[order[returns] - n_launched]
    del order, returns
    first = np.ones(len(p_rank), bool)
    first[1:] = p_rank[1:] != p_rank[:-1]
    chained = ~first
    # a step's first launch on each rank, or a launch just before it (a transfer posted for the step before):
    # where the hosts left a barrier together, they follow it
    opens = np.flatnonzero(chained & p_launch & (p_step != np.roll(p_step, 1)))
    opened = p_step[opens]  # the step each opens
    segment = np.searchsorted(p_rank, p_rank[opens])  # each one's rank's first point
    opens = np.array([lo + int(np.searchsorted(p_time[lo:f + 1], p_time[f] - BARRIER_NS)) for lo, f in
                      zip(segment.tolist(), opens.tolist(), strict=True)], np.int64)
    valid = (opens > segment) & p_launch[opens]
    opens, opened = opens[valid], opened[valid]
    barriers = 0
    for k, s in enumerate(np.unique(opened).tolist()):
        at = opens[opened == s]
        if len(np.unique(p_rank[at])) < 2 or len(at) != len(np.unique(p_rank[at])):
            continue
        leave, arrive = p_time[at], p_time[at - 1]
        gap = int(leave.min() - arrive.max())
        if leave.max() - leave.min() > BARRIER_NS or arrive.max() - arrive.min() <= leave.max() - leave.min() + \
                BARRIER_NS or gap < 0:
            continue
        edges.add(BARRIER, p_node[at - 1], np.full(len(at), b_base + k), gap)
        edges.add(BARRIER, np.full(len(at), b_base + k), p_node[at], leave - leave.min())
        chained[at] = False
        barriers += 1
    c = np.flatnonzero(chained)
    edges.add(HOST, p_node[c - 1], p_node[c], p_own[c] - p_time[c - 1])
    heads = np.flatnonzero(first)
    edges.add(ANCHOR, w_of_rank[p_rank[heads]], p_node[heads], p_time[heads] - root_of_rank[p_rank[heads]])
    edges.add(HOST_WAIT, n + w_event, r_node, np.where(blocked, np.maximum(0, w_end - end[w_event]), 0))
    counts["host"] = len(c)
    counts["host_wait"] = int(ok.sum())
    counts["barrier"] = barriers
    if before is None:
        return None
    last = np.flatnonzero(np.append(p_rank[1:] != p_rank[:-1], True)) if len(p_rank) else np.zeros(0, np.int64)
    return pl.DataFrame({"rank": p_rank[last], "time_ns": p_time[last], "step": p_step[last].astype(np.int64),
                         "node": p_node[last].astype(np.int64)})


def _row_lookup(events: pl.DataFrame):
    """A function (ranks, event ids) -> row numbers in ``events`` (-1 where absent). The asked keys are few (syncs)
    and the events many: an inner join hashes the asked side (a left join of them hashed every event: at 1,024
    synthesized ranks the graph's peak)."""
    key = events.select(pl.col("rank").cast(pl.Int32), "event_id").with_row_index("row")

    def rows(ranks: pl.Series, ids: pl.Series) -> np.ndarray:
        asked = pl.DataFrame({"rank": ranks.cast(pl.Int32), "event_id": ids.cast(pl.Int64)}).with_row_index("i")
        found = key.join(asked, on=["rank", "event_id"], how="inner")
        out = np.full(asked.height, -1, np.int64)
        out[found["i"].to_numpy()] = found["row"].to_numpy()
        return out

    return rows


def rank_delays(statistics: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per rank (:data:`STATISTICS`): the launch latency the edges use (the median where the rank has one, else
    the least: a bound no start undercuts; never below 0) and the spacing of queued kernels (never below 0)."""
    lat, least = statistics["launch"], statistics["least launch"]
    return np.maximum(np.where(lat >= 0, lat, least), 0), np.maximum(statistics["spacing"], 0)


def _ready(rank: np.ndarray, recorded: np.ndarray, spaced: np.ndarray, launched: np.ndarray, launch: np.ndarray,
           waits: np.ndarray, lat: np.ndarray, spacing: np.ndarray) -> np.ndarray:
    """When each event could start by what is recorded: its stream's previous end or the carried-over stream
    (``recorded``), plus the rank's spacing where it was queued behind it (``spaced``); its launch plus the rank's
    latency; the ends of the events it waited for (``waits``)."""
    ready = recorded + np.where(spaced, spacing[rank], 0)
    ready = np.where(launched, np.maximum(ready, launch + lat[rank]), ready)
    return np.maximum(ready, waits)


def lag_statistic(candidates: list[tuple[np.ndarray, ...]], statistics: dict[str, np.ndarray], size: int
                  ) -> np.ndarray:
    """The run's per-rank lag (:data:`STATISTICS`) from a first pass's candidates (launched starts at most
    INFER_WITHIN_NS after another stream's end, with what decides their readiness), once the run's delays are
    known: the samples a graph with those delays takes (build's ``infer``), without a second pass."""
    if not candidates:
        return per_rank_quantile(np.zeros(0, np.int64), np.zeros(0, np.int64), size, STATISTICS["lag"])
    rank, start, other_end, recorded, touching, launch, waits = (
        np.concatenate(column) for column in zip(*candidates, strict=True))
    rank = rank.astype(np.int64)
    lat, spacing = rank_delays(statistics)
    ready = _ready(rank, recorded, touching, np.ones(len(rank), bool), launch, waits, lat, spacing)
    infer = (start > ready + SLACK_NS) & (other_end > ready)
    return per_rank_quantile(rank[infer], (start - other_end)[infer], size, STATISTICS["lag"])


def per_rank_quantile(rank: np.ndarray, value: np.ndarray, size: int, q: float) -> np.ndarray:
    """The ``q`` quantile of ``value`` per rank (-1 where a rank has none)."""
    out = np.full(size, -1, np.int64)
    if len(rank):
        frame = pl.DataFrame({"rank": rank, "v": value}).group_by("rank").agg(pl.col("v").quantile(q, "linear"))
        out[frame["rank"].to_numpy()] = np.round(frame["v"].to_numpy()).astype(np.int64)
    return out


def _latest_end_before(rank: np.ndarray, start: np.ndarray, end_rank: np.ndarray, end: np.ndarray,
                       begin: np.ndarray) -> np.ndarray:
    """For each (rank, start), the row of the candidate (end_rank, end, begun at ``begin``; zero-length ones left
    out, so an event never finds itself) with the latest end <= start on that rank (of equal ends, the last row),
    or -1. A binary search in each rank's sorted ends, a rank at a time: DuckDB's ASOF join of the same took
    1.7 GiB beside the graph for the 9.7 M events of 1,024 copies of a real rank."""
    out = np.full(len(rank), -1, np.int64)
    kept = np.flatnonzero(end > begin)
    by_end = kept[np.lexsort((kept, end[kept], end_rank[kept]))]  # by rank, end, row
    ends, ranks = end[by_end], end_rank[by_end]
    asking = np.argsort(rank, kind="stable")
    for r in np.unique(rank).tolist():
        q = asking[np.searchsorted(rank, r, "left", sorter=asking):np.searchsorted(rank, r, "right", sorter=asking)]
        lo, hi = np.searchsorted(ranks, r, "left"), np.searchsorted(ranks, r, "right")
        if hi > lo:  # else no candidate on the rank: -1
            at = np.searchsorted(ends[lo:hi], start[q], "right") - 1
            out[q] = np.where(at >= 0, by_end[lo:hi][np.maximum(at, 0)], -1)
    return out
