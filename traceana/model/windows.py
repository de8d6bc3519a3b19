"""Replay a run a window of steps at a time (DESIGN §8), so that a replay's memory follows a window's events, not
the run's: every node gets the time the run's whole graph (graph.py) gives it, window by window.

What a window's graph needs from the steps before it (:class:`traceana.model.graph.Context`), carried from window to
window as a few rows per rank and stream: each stream's last event (what the next one on the stream follows) and the
event that ended last on it (what an unexplained start is taken to wait for), the events still running into the
window, the events that later recorded waits wait for, each rank's last host point; these keep the times their own
window's replay gave them. The per-rank statistics the weights use (launch latency, queue spacing, inferred lag) are
quantiles over the whole run: two passes over the windows measure them before the pass that replays.

Windows are cut only between steps no collective instance spans, where every rank's host points of the steps after
come more than :data:`~traceana.model.graph.BARRIER_NS` after those of the steps before and no recorded stream wait
points back across the cut: elsewhere an edge would point from a later window to an earlier one. A run with no such
cut is one window, its whole graph.

The events are read once into a Parquet file in the temporary folder, in step order, and each window from there.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from traceana.model import graph as dependency
from traceana.model.graph import BARRIER_NS, CARRIED_SQL, EVENTS_SQL, NAMES_SQL, Context, Graph

# events a window holds before it is cut (where a cut is allowed): 1.6 M at 1,024 copies of a real rank
WINDOW_EVENTS = 1_000_000

ORDER = ["rank", "stream", "start_ns", "end_ns", "event_id"]  # EVENTS_SQL's order, which a graph's rows keep


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


def replayed(con: duckdb.DuckDBPyConnection, run_id: str, window_events: int = WINDOW_EVENTS) -> Replayed:
    """Replay ``run_id`` window by window (module doc): three passes over its windows, the last one replaying."""
    from traceana.model.replay import ranks_of

    params = {"run": run_id}
    with tempfile.TemporaryDirectory(prefix="traceana-windows-") as folder:
        events, names = _spilled(con, run_id, Path(folder) / "events.parquet")
        spans = cuts(con, run_id, str(events), window_events)
        run = _Run(run_id, events, spans,
                   con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = $run "
                           "ORDER BY rank, start_ns", params=params).pl(),
                   con.sql(CARRIED_SQL, params=params).pl(), _window_syncs(con, run_id, str(events), spans))
        statistics: dict[str, np.ndarray] = {}
        for measured in (("launch", "least launch", "spacing"), ("lag",)) if len(spans) > 1 else ():
            samples: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
            run.walk(statistics, samples)
            size = int(run.firsts["rank"].max()) + 1
            statistics |= {name: _quantile(samples.get(name, []), size, name) for name in measured}
        counts: dict[str, int] = {}
        facts: dict[str, int] = {}
        windows, parts = [], []
        pending = None  # the last window's replayed events and windows, until the next window's starts are known
        ranks = ranks_of(con, run_id)

        def measure(g: Graph, times: np.ndarray, pinned: np.ndarray) -> None:
            nonlocal pending
            _add_counts(counts, g.counts)
            for key, value in g.facts.items():
                facts[key] = facts.get(key, 0) + value
            windows.append(g.windows)
            done = _window_timeline(g, times, pinned)
            if pending is not None:
                parts.append(_breakdown(pending, done, run.firsts, names, ranks, run_id))
            pending = done

        run.walk(statistics, {}, measure)
        if pending is not None:
            parts.append(_breakdown(pending, None, run.firsts, names, ranks, run_id))
    breakdown = pl.concat(parts).sort("step", "rank") if parts else pl.DataFrame()
    return Replayed(counts, facts, pl.concat(windows) if windows else pl.DataFrame(), breakdown)


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


def _quantile(samples: list[tuple[np.ndarray, np.ndarray]], size: int, name: str) -> np.ndarray:
    """A per-rank statistic of :data:`~traceana.model.graph.STATISTICS` over every window's samples."""
    rank = np.concatenate([r for r, _ in samples]) if samples else np.zeros(0, np.int64)
    value = np.concatenate([v for _, v in samples]) if samples else np.zeros(0, np.int64)
    return dependency.per_rank_quantile(rank, value, size, dependency.STATISTICS[name])


def _spilled(con: duckdb.DuckDBPyConnection, run_id: str, path: Path) -> tuple[Path, pl.Series]:
    """The run's events (EVENTS_SQL's rows, each name as its index in the run's names) written to ``path`` in step
    order, so that a window is read from its row groups; and the names."""
    params = {"run": run_id}
    names = con.sql(NAMES_SQL, params=params).arrow().read_all()["name"].combine_chunks()
    con.register("event_names", pa.table({"name": names, "name_id": pa.array(range(len(names)), pa.uint32())}))
    try:
        con.sql(f"SELECT * FROM ({EVENTS_SQL}) ORDER BY step, {', '.join(ORDER)}",
                params=params).write_parquet(str(path), row_group_size=100_000)
    finally:
        con.unregister("event_names")
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
    blocked = set()
    # a collective instance's members in more than one step: no cut between its first and last
    for lo, hi in con.sql(f"SELECT min(step), max(step) FROM '{events}' WHERE instance IS NOT NULL "
                          "GROUP BY instance HAVING min(step) < max(step)").fetchall():
        blocked.update(s for s in steps if lo <= s < hi)
    # host points (launches; wait returns at their waited event's step) of a later step before, or within
    # BARRIER_NS after, those of an earlier one
    points = con.sql(f"""
        WITH firsts AS (SELECT rank, min(start_ns) AS first_ns FROM step_windows WHERE run_id = $run GROUP BY rank),
        p AS (SELECT e.rank, e.step, e.launch_ns AS t FROM '{events}' e JOIN firsts f USING (rank)
              WHERE e.launch_ns IS NOT NULL AND e.start_ns >= f.first_ns
              UNION ALL
              SELECT s.rank, e.step, s.end_ns FROM syncs s JOIN '{events}' e
                ON e.rank = s.rank AND e.event_id = s.waited_event_id
              WHERE s.run_id = $run AND s.kind = 'host_wait')
        SELECT rank, step, min(t) AS lo, max(t) AS hi FROM p GROUP BY rank, step ORDER BY rank, step""",
                     params=params).pl() if _has_syncs(con) else pl.DataFrame()
    if points.height:  # a cut after step s, on each rank: its points up to s + BARRIER_NS before its later ones
        spans = points.with_columns(
            pl.col("hi").cum_max().over("rank").alias("before"),
            pl.col("lo").reverse().cum_min().reverse().shift(-1).over("rank").alias("after"),
            pl.col("step").shift(-1).over("rank").alias("next_step"))
        for lo, hi in spans.filter(pl.col("after") <= pl.col("before") + BARRIER_NS).select(
                "step", "next_step").iter_rows():
            blocked.update(s for s in steps if lo <= s < hi)
    if _has_syncs(con):  # a stream wait whose waited event is in a later step than its waiter
        for lo, hi in con.sql(f"""
                SELECT w.step, d.step FROM syncs s
                JOIN '{events}' d ON d.rank = s.rank AND d.event_id = s.waited_event_id
                JOIN '{events}' w ON w.rank = s.rank AND w.event_id = s.waiter_event_id
                WHERE s.run_id = $run AND s.kind = 'stream_wait' AND d.step > w.step""", params=params).fetchall():
            blocked.update(s for s in steps if lo <= s < hi)
    windows, first, held = [], steps[0], 0
    for i, (step, n) in enumerate(per_step):
        held += n
        if held >= window_events and step not in blocked and i + 1 < len(steps):
            windows.append((first, step))
            first, held = steps[i + 1], 0
    return [*windows, (first, steps[-1])]


def _has_syncs(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'syncs'")
                .fetchall()[0][0])
class _Run:
    """A run's events (the Parquet file of :func:`_spilled`), windows (``spans``: first, last step), step windows,
    streams carried over from before its first window, and syncs (with their window): walked window by window."""

    def __init__(self, run_id: str, events: Path, spans: list[tuple[int, int]], windows: pl.DataFrame,
                 carried: pl.DataFrame, syncs: pl.DataFrame) -> None:
        self.run_id, self.events, self.spans, self.windows, self.carried, self.syncs = (
            run_id, events, spans, windows, carried, syncs)
        self.firsts = windows.group_by("rank").agg(pl.col("start_ns").min()).sort("rank")

    def walk(self, statistics: dict[str, np.ndarray], samples: dict[str, list[tuple[np.ndarray, np.ndarray]]],
             replayed: Callable[[Graph, np.ndarray, np.ndarray], None] | None = None) -> None:
        """Build each window's graph (its own events and the earlier ones it needs, pinned); with ``replayed``,
        replay it and give it (the graph, each node's time, which rows are pinned). A window's arrays are let go
        before the next is read: with two windows' at once, a window of 3.2 M events peaked at 2.8 GiB."""
        from traceana.model.replay import longest_path

        past = None
        host = pl.DataFrame(schema={"rank": pl.Int32, "time_ns": pl.Int64, "step": pl.Int64, "at_ns": pl.Int64})
        for k, (a, b) in enumerate(self.spans):
            own = (pl.scan_parquet(self.events).filter(pl.col("step").is_between(a, b)).collect()
                   .with_columns(at_start=pl.lit(None, pl.Int64), at_end=pl.lit(None, pl.Int64)))
            rows = (own if past is None else pl.concat([past, own], how="vertical_relaxed")).sort(
                ORDER, nulls_last=True, maintain_order=True)
            pinned = rows["at_start"].is_not_null().to_numpy()
            given = tuple(rows[c].fill_null(0).to_numpy()[pinned] for c in ("at_start", "at_end"))  # int64, no NaN
            context = Context(pinned, given, host, self.firsts, statistics, samples, edges=replayed is not None)
            g = dependency.from_frames(self.run_id, rows.drop("at_start", "at_end"),
                                       self.windows.filter(pl.col("step").is_between(a, b)),
                                       self.syncs.filter(pl.col("window") == k).drop("window"), self.carried, context)
            n = rows.height
            del own, given, context
            if replayed is not None:
                times = longest_path(g)
                g.src = g.dst = g.weight = g.kind = g.event = np.zeros(0, np.int64)  # read no further: let them go
                replayed(g, times, pinned)
            else:
                times = np.zeros(g.n_nodes, np.int64)
                times[:n], times[n:2 * n] = rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()
            if k + 1 < len(self.spans):
                start = times[:n]
                past = self._past(rows.with_columns(at_start=pl.Series(start),
                                                    at_end=pl.Series(np.maximum(times[n:2 * n], start))), k)
                last = g.last_host if g.last_host is not None else pl.DataFrame()
                host = last.with_columns(at_ns=pl.Series(times[last["node"].to_numpy()])).drop("node").cast(
                    host.schema) if last.height else host.clear()
                del start
            del g, times, rows, pinned

    def _past(self, rows: pl.DataFrame, k: int) -> pl.DataFrame:
        """Of a window's rows (with their replayed times), those the windows after it need (module doc)."""
        rows = rows.with_row_index("r")
        a, b = self.spans[k + 1]
        next_ns = (self.windows.filter(pl.col("step").is_between(a, b)).group_by("rank")
                   .agg(pl.col("start_ns").min().alias("next_ns")))
        waited = (self.syncs.filter(pl.col("window") > k)
                  .select("rank", pl.col("waited_event_id").alias("event_id")).unique())
        keep = pl.concat([
            rows.group_by("rank", "stream").agg(pl.col("r").max()).select("r"),
            rows.filter(pl.col("end_ns") > pl.col("start_ns")).group_by("rank", "stream")
                .agg(pl.col("r").sort_by("end_ns", "r").last()).select("r"),
            rows.join(next_ns, on="rank").filter(pl.col("end_ns") >= pl.col("next_ns")).select("r"),
            rows.join(waited.cast({"rank": rows.schema["rank"]}), on=["rank", "event_id"], how="semi").select("r"),
        ]).unique()["r"].sort()
        return rows[keep.to_numpy()].drop("r")


def _window_timeline(g: Graph, times: np.ndarray, pinned: np.ndarray) -> tuple[pl.DataFrame, np.ndarray,
                                                                            pl.DataFrame]:
    """(every row of a window's graph with its replayed times, which are pinned, its step windows with their own
    events' last replayed end and first replayed start)."""
    n = g.n
    start = times[:n]
    events = g.events.with_columns(start_ns=pl.Series(start), end_ns=pl.Series(np.maximum(times[n:2 * n], start)))
    own = events.select("rank", "step", "start_ns", "end_ns").filter(pl.Series(~pinned))
    last = own.group_by("rank", "step").agg(pl.col("end_ns").max().alias("last_ns"))
    first = (own.filter(pl.Series(~g.straddles[~pinned])).group_by("rank", "step")
             .agg(pl.col("start_ns").min().alias("first_ns")))
    windows = g.windows.join(last, on=["rank", "step"], how="left").join(first, on=["rank", "step"], how="left")
    return events, pinned, windows


def _breakdown(window: tuple[pl.DataFrame, np.ndarray, pl.DataFrame],
               following: tuple[pl.DataFrame, np.ndarray, pl.DataFrame] | None, firsts: pl.DataFrame,
               names: pl.Series, ranks: pl.DataFrame, run_id: str) -> pl.DataFrame:
    """A window's replayed breakdown per rank and step, measured as replay.simulate measures a run: its step
    windows end where the ``following`` window's start."""
    from traceana.model.replay import breakdown_of, meets, replayed_windows, simulated_store

    events, _, windows = window
    both = windows if following is None else pl.concat([windows, following[2]], how="vertical_relaxed")
    both = both.join(firsts.rename({"start_ns": "run_first_ns"}), on="rank", how="left").sort("rank", "start_ns")
    steps = windows.select("rank", "step")
    final = replayed_windows(both, pl.col("start_ns") == pl.col("run_first_ns")).join(steps, on=["rank", "step"],
                                                                                      how="semi")
    span = final.group_by("rank").agg(pl.col("start_ns").min(), pl.col("end_ns").max())  # a window's steps: one span
    if following is not None:  # the next window's events that start by the window's end
        later, pinned, _ = following
        events = pl.concat([events, later.filter(pl.Series(~pinned & meets(later, span)))], how="vertical_relaxed")
    events = events.filter(pl.Series(meets(events, span)))
    events = events.with_columns(name=names.gather(events["name"]))
    with simulated_store([(run_id, events, final)], ranks) as sim:
        return breakdown_of(sim, run_id)
