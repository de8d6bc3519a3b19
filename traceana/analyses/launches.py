"""Behind `traceana kernels --launch`: what HTA users take for granted about kernel launches. The launch delay of
every device event with a launch record (view kernel_launches: from the start of the host's runtime call to the
event's start on the device) per kernel short name, rank, step and time bucket, with the share of events shorter
than their rank's launch cost; and the queue length of each stream (view queue_length: events launched but not yet
started), summed up per rank and stream and decimated over time for plots.

Runs without launch records (CPU-only traces, Ascend, msprof) have none of this: the frames are empty and
:func:`notes` says why in one line, which the command prints instead of a table.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana import store
from traceana.errors import TraceanaError

# The delay statistics every grouping reports (µs), over the events of the group.
_DELAYS = """count(*) AS events, avg(delay_ns) / 1e3 AS mean_delay_us, median(delay_ns) / 1e3 AS p50_delay_us,
             quantile_cont(delay_ns, 0.95) / 1e3 AS p95_delay_us, max(delay_ns) / 1e3 AS max_delay_us,
             100 * avg(short::INT) AS short_pct"""


def _query(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object]) -> pl.DataFrame:
    """A query over the launch views; a store written before launch_ns existed gets the one-line ingest-again error."""
    try:
        return con.sql(sql, params=params).pl()
    except (duckdb.BinderException, duckdb.CatalogException):  # no launch_ns column, so no view over it either
        raise TraceanaError(store.OUTDATED) from None


def compute_once(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Compute view kernel_launches once for the run (:func:`traceana.store.materialize`): the notes and three
    tables read it, each a sort of every launched event otherwise."""
    try:
        store.materialize(con, "kernel_launches", run_id)
    except (duckdb.BinderException, duckdb.CatalogException):  # as in _query
        raise TraceanaError(store.OUTDATED) from None


def by_kernel(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per kernel short name and category, most launched first: events, mean duration, the delay's mean, p50, p95
    and max (µs), and the share of its events shorter than their rank's launch cost (short_pct)."""
    return _query(con, f"""
        SELECT short_name, category, {_DELAYS}, avg(duration_ns) / 1e3 AS mean_duration_us
        FROM kernel_launches WHERE run_id = $run
        GROUP BY short_name, category ORDER BY events DESC, short_name, category""", {"run": run_id})


def by_rank(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per rank: its launch cost (the median delay onto an idle device, µs) and events launched onto an idle device,
    then the delay statistics over all its events."""
    return _query(con, f"""
        SELECT rank, any_value(pp) AS pp, any_value(launch_cost_ns) / 1e3 AS launch_cost_us,
               count(*) FILTER (WHERE idle_device) AS idle_device_events, {_DELAYS}
        FROM kernel_launches WHERE run_id = $run GROUP BY rank ORDER BY rank""", {"run": run_id})


def by_step(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per step, over the events of every rank that start in that rank's window: ranks, then the delay statistics.
    Events outside every step window are left out (counted by :func:`notes`)."""
    return _query(con, f"""
        SELECT step, count(DISTINCT rank) AS ranks, {_DELAYS}
        FROM kernel_launches WHERE run_id = $run AND step IS NOT NULL GROUP BY step ORDER BY step""",
                  {"run": run_id})


def origin_ns(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The run's first launch: time zero of the series below (the queue length is defined from there on)."""
    return _query(con, "SELECT min(launch_ns) AS ns FROM device_events WHERE run_id = $run", {"run": run_id}).item()


def _bucket_ns(con: duckdb.DuckDBPyConnection, run_id: str, buckets: int) -> tuple[int, int]:
    """(origin, bucket width) cutting the run's launched span, first launch to last start, into ``buckets``."""
    if buckets < 1:
        raise TraceanaError(f"buckets={buckets}: must be at least 1")
    first, last = _query(con, "SELECT min(launch_ns), max(start_ns) FROM device_events WHERE run_id = $run AND "
                         "launch_ns IS NOT NULL", {"run": run_id}).row(0)
    return (first or 0), max(1, -(-((last or 0) - (first or 0) + 1) // buckets))


def over_time(con: duckdb.DuckDBPyConnection, run_id: str, buckets: int = 200) -> pl.DataFrame:
    """The delay over time, all ranks pooled: the run's launched span cut into ``buckets`` equal buckets by event
    start; per bucket its start and end (ms since the first launch), then the delay statistics."""
    origin, width = _bucket_ns(con, run_id, buckets)
    return _query(con, f"""
        SELECT b * $width / 1e6 AS start_ms, (b + 1) * $width / 1e6 AS end_ms, {_DELAYS}
        FROM (SELECT *, (start_ns - $origin) // $width AS b FROM kernel_launches WHERE run_id = $run)
        GROUP BY b ORDER BY b""", {"run": run_id, "origin": origin, "width": width})


def queue_summary(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per rank and stream, longest mean queue first: events queued, the span from the first launch to the last
    start (ms), the queue length's mean over that span (time-weighted, not over change points as HTA's describe()
    takes it) and its max, and the share of the span with at least one event waiting (busy_queue_pct)."""
    return _query(con, """
        WITH queued AS (
            SELECT rank, stream, count(*) AS events FROM device_events
            WHERE run_id = $run AND launch_ns IS NOT NULL GROUP BY rank, stream
        )
        SELECT rank, stream, any_value(events) AS events, (max(ts_ns) - min(ts_ns)) / 1e6 AS span_ms,
               sum(queue_length * (until_ns - ts_ns)) / nullif(max(ts_ns) - min(ts_ns), 0) AS mean_queue,
               max(queue_length) AS max_queue,
               100 * sum(until_ns - ts_ns) FILTER (WHERE queue_length > 0) / nullif(max(ts_ns) - min(ts_ns), 0)
                   AS busy_queue_pct
        FROM queue_length JOIN queued USING (rank, stream)
        WHERE run_id = $run
        GROUP BY rank, stream ORDER BY mean_queue DESC NULLS LAST, rank, stream""", {"run": run_id})


def queue_over_time(con: duckdb.DuckDBPyConnection, run_id: str, buckets: int = 200) -> pl.DataFrame:
    """The queue length of each rank and stream, decimated: the launched span cut into ``buckets`` equal buckets;
    per bucket its start and end (ms since the first launch), the time-weighted mean and the max of the queue over
    the bucket (the max keeps every peak a finer series would show). Buckets where the stream's series is not
    defined yet, or no more, are left out."""
    origin, width = _bucket_ns(con, run_id, buckets)
    return _query(con, """
        WITH pieces AS (  -- each constant stretch of the step function, in every bucket it touches
            SELECT rank, stream, queue_length, ts_ns, until_ns, unnest(range((ts_ns - $origin) // $width,
                   (until_ns - 1 - $origin) // $width + 1)) AS b
            FROM queue_length WHERE run_id = $run AND until_ns IS NOT NULL
        )
        SELECT rank, stream, b * $width / 1e6 AS start_ms, (b + 1) * $width / 1e6 AS end_ms,
               sum(queue_length * (least(until_ns, $origin + (b + 1) * $width) - greatest(ts_ns, $origin + b * $width)))
                   / $width AS mean_queue,
               max(queue_length) AS max_queue
        FROM pieces GROUP BY rank, stream, b ORDER BY rank, stream, b""",
                  {"run": run_id, "origin": origin, "width": width})


def notes(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """What the statistics leave out, one line each: the whole run when it has no launch records, else the device
    events without one, the launched events outside every step window (not in :func:`by_step`), and the events
    that start before their launch call (clock error: their delay is read as 0)."""
    events, launched, early = _query(
        con, "SELECT count(*), count(launch_ns), count(*) FILTER (WHERE start_ns < launch_ns) FROM device_events "
        "WHERE run_id = $run", {"run": run_id}).row(0)
    if not launched:
        why = ("it has no device events" if not events else "CPU-only traces, Ascend and msprof do not record the "
               "host call that launched each device task")
        return [f"run {run_id!r} has no launch records ({why}), so no launch statistics and no queue length"]
    outside = _query(con, "SELECT count(*) FILTER (WHERE step IS NULL) FROM kernel_launches WHERE run_id = $run",
                     {"run": run_id}).item()
    found = []
    if launched < events:
        found.append(f"{events - launched:,} of {events:,} device events have no launch record (launched before the "
                     "capture began, or by a path the trace does not correlate): not in these statistics")
    if outside:
        found.append(f"{outside:,} launched events start outside every step window: in the per-kernel and per-rank "
                     "figures, not in the per-step ones")
    if early:
        found.append(f"{early:,} events start before their launch call (the host and device clocks disagree): "
                     "their delay is read as 0")
    return found


HOST_LEVELS, LONGEST = 3, 12  # the host tree's levels a timeline draws; the kernels per rank it traces to the host


def host_lanes(con: duckdb.DuckDBPyConnection, run_id: str, step: int,
               ranks: list[int]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """For a timeline of step ``step``: the host ranges of ``ranks`` in the step's window, down to HOST_LEVELS
    levels of each thread's tree (rank, thread, depth, start_ns, end_ns, name, kind: view host_ranges), and the
    LONGEST device events of each rank in it with the host range that launched them (rank, launch_ns: in the
    range, start_ns, end_ns, kernel: its short name, op: the range's name, depth: its; view event_launchers: the CPU
    op, or for nsys the innermost NVTX range on the launching thread). Empty for a store
    ingested before annotations had threads."""
    params = {"run": run_id, "step": step, "ranks": ranks}
    window = ("JOIN step_windows w ON w.run_id = x.run_id AND w.rank = x.rank AND w.step = $step "
              "AND x.end_ns > w.start_ns AND x.start_ns < w.end_ns")
    try:
        host = con.sql(f"""SELECT x.rank, x.thread, x.depth, x.start_ns, x.end_ns, x.name, x.kind
            FROM host_ranges x {window}
            WHERE x.run_id = $run AND x.depth <= {HOST_LEVELS} AND list_contains($ranks, x.rank)""",
                       params=params).pl()
        launches = con.sql(f"""SELECT x.rank, l.launch_ns, x.start_ns, x.end_ns, k.short_name AS kernel, l.op, l.depth
            FROM event_launchers l JOIN device_events x USING (run_id, rank, event_id) {window}
            LEFT JOIN kernel_names k ON k.run_id = x.run_id AND k.name = x.name
            WHERE l.run_id = $run AND list_contains($ranks, x.rank)
            QUALIFY row_number() OVER (PARTITION BY x.rank ORDER BY x.end_ns - x.start_ns DESC, x.event_id)
                    <= {LONGEST}
            ORDER BY x.rank, x.event_id""", params=params).pl()
    except duckdb.CatalogException:  # annotations without a thread column: no host_ranges view
        return pl.DataFrame(), pl.DataFrame()
    return host, launches
