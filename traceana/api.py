"""The Python API for notebooks: ``traceana.open(db)`` and one method per report, each a polars DataFrame.

Every method opens the store read-only for the call (as the report commands do), so a notebook never holds a lock
against `traceana ingest` and always sees the latest ingest. Times are in ms where the name says ``_ms`` and ns
where it says ``_ns``, as in the CLI's ``--json``. ``frame.to_pandas()`` needs the ``pandas`` extra
(``pip install 'traceana[pandas]'``).

A new analysis adds one method here, reading its view through :meth:`Traces.read`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

from traceana import breakdown as bd
from traceana import store
from traceana.errors import TraceanaError

T = TypeVar("T")


class Traces:
    """A traceana store opened read-only. ``run``: the run methods read when they are not given one (default: the
    latest ingested run, as on the command line)."""

    def __init__(self, db: str | Path = store.DEFAULT_DB, run: str | None = None) -> None:
        self.db = Path(db)
        self.run = run
        with store.connect(self.db, read_only=True) as con:  # a one-line error now for a missing file or run
            if run is not None:
                store.resolve_run(con, run)

    def __repr__(self) -> str:
        return f"traceana.open({str(self.db)!r}, run={self.run!r})"

    def read(self, run: str | None, read: Callable[[duckdb.DuckDBPyConnection, str], T]) -> T:
        """``read(connection, run_id)`` on a read-only connection, for the run named here, else ``self.run``."""
        with store.connect(self.db, read_only=True) as con:
            return read(con, store.resolve_run(con, run or self.run))

    def runs(self) -> pl.DataFrame:
        """One row per ingested run: format, world size, layout, sources, notes."""
        with store.connect(self.db, read_only=True) as con:
            return con.sql("SELECT * FROM runs ORDER BY ingested_at").pl()

    def ranks(self, run: str | None = None) -> pl.DataFrame:
        """The run's ranks with host, device, clock offset and tp cp ep dp pp coordinates."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM ranks WHERE run_id = ? ORDER BY rank", params=[rid]).pl())

    def steps(self, run: str | None = None) -> pl.DataFrame:
        """Each rank's step windows (ns on the run's aligned clock); ``from_markers`` false: the whole trace."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM step_windows WHERE run_id = ? ORDER BY step, rank", params=[rid]).pl())

    def breakdown(self, by: str = "rank", step: int | None = None, run: str | None = None) -> pl.DataFrame:
        """Where step time went (ms): per rank, or per pipeline stage (mean and max over its ranks); ``step`` None
        is the typical step (mean over steps after the first)."""
        if by not in ("rank", "stage"):
            raise TraceanaError(f"by={by!r}: choose 'rank' or 'stage'")
        reader = bd.by_rank if by == "rank" else bd.by_stage
        return self.read(run, lambda con, rid: reader(con, rid, step))

    def stragglers(self, run: str | None = None) -> pl.DataFrame:
        """Per rank (ms): typical COMP against its stage's median, the straggler stage, lateness it caused."""
        return self.read(run, bd.stragglers)

    def late_ranks(self, run: str | None = None, top: int = 10) -> pl.DataFrame:
        """The ranks most often last to arrive at collectives, by dim, with the wait they caused (ms)."""
        return self.read(run, lambda con, rid: bd.late_ranks(con, rid, top))

    def waits(self, run: str | None = None) -> pl.DataFrame:
        """Each rank's part in each collective instance: its start, the last arrival, how long it waited (ns)."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM collective_waits WHERE run_id = ? ORDER BY instance, rank",
            params=[rid]).pl())

    def collectives(self, run: str | None = None) -> pl.DataFrame:
        """One row per collective instance matched across its ranks: spreads, last rank, total wait (ns)."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM collective_instances WHERE run_id = ? ORDER BY first_start_ns",
            params=[rid]).pl())

    def collective_summary(self, run: str | None = None) -> pl.DataFrame:
        """Per dim and op: collective instances seen on several ranks, how far apart the ranks arrived (mean and
        max start spread, ms) and the total wait the last arrivals caused (ms)."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT dim, op, count(*) AS instances, round(avg(ranks_seen), 1) AS mean_ranks, "
            "avg(start_spread_ns) / 1e6 AS mean_start_spread_ms, max(start_spread_ns) / 1e6 AS max_start_spread_ms, "
            "sum(total_wait_ns) / 1e6 AS caused_wait_ms FROM collective_instances "
            "WHERE run_id = ? AND ranks_seen > 1 GROUP BY ALL ORDER BY caused_wait_ms DESC", params=[rid]).pl())

    def timeline(self, step: int | None = None, run: str | None = None) -> pl.DataFrame:
        """One step's activity across ranks: rank, pp, lane (COMP or a comm dim), start_ns, end_ns — what the
        `timeline` Gantt draws. ``step`` None: the first analysed step (the first after the warm-up one)."""
        def intervals_of(con: duckdb.DuckDBPyConnection, rid: str) -> pl.DataFrame:
            windows, intervals = bd.timeline(con, rid, bd.first_analysed_step(con, rid) if step is None else step)
            return intervals.join(windows.select("rank", "pp"), on="rank", how="left").select(
                "rank", "pp", "lane", "start_ns", "end_ns").sort("rank", "start_ns", "lane")
        return self.read(run, intervals_of)

    def compare(self, config: str | Path, run: str | None = None) -> pl.DataFrame:
        """Estimate (job YAML ``config``) versus measured, per dimension (ms), as `traceana compare` prints it."""
        from traceana.compare import compare_run
        from traceana.estimator import config as cfgmod
        from traceana.estimator.estimate import estimate

        est = estimate(cfgmod.load(Path(config)))
        return self.read(run, lambda con, rid: compare_run(con, rid, est).by_dimension)

    def sql(self, query: str, run: str | None = None) -> pl.DataFrame:
        """Ad-hoc SQL over the tables and views; with ``run`` (or the run given to open), that run's rows only."""
        if not query.strip():
            raise TraceanaError("sql: the query is empty")
        with store.connect(self.db, read_only=True) as con:
            if run or self.run:
                store.restrict_to_run(con, store.resolve_run(con, run or self.run))
            try:
                relation = con.sql(query)
                if relation is None:
                    raise TraceanaError("sql: the statement returns no rows (sql runs queries such as SELECT)")
                return relation.pl()
            except duckdb.Error as exc:
                raise TraceanaError(f"query failed: {str(exc).splitlines()[0]}") from None
