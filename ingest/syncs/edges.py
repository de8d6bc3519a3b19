"""Which device events a synchronization waits for, by ASOF joins per rank (and stream): one vectorized pass per
rule, never a loop per event. A replay engine rebuilds the run's dependency graph from these edges.

- host_wait (the host blocked until device work ended): among the rank's device events launched before the call
  started (before the event record call, for an event synchronize whose record the trace names; on the synchronized
  or recorded stream where the trace says which, else on any), the one with the latest end that is at most the
  call's end plus ``TOLERANCE_NS`` (of equal ends, the later launched: the copy a cudaStreamSynchronize follows,
  not a kernel of another stream that ended at the same microsecond); a blocking memcpy waits for its own copy
  (``own_event_id``).
- stream_wait on host times (a wait call issued after an event record call): waited = the last event on the recorded
  stream launched before the record call, waiter = the first event on the waiting stream launched after the wait call.
- stream_wait on device times (record and wait are device tasks, Ascend): waited = the last event on the recorded
  stream that ended by the record task's start, waiter = the first event on the waiting stream that starts at or
  after the wait task's end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

TOLERANCE_NS = 2_000  # a call returns a little after the event it waited for ends; clocks round to 1 us (Kineto)
COLUMNS = ("rank", "kind", "name", "start_ns", "end_ns", "waited_event_id", "waiter_event_id")
_I64 = pl.Int64()


def _launched(events: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Events with a launch time, sorted by it, with the latest end (and its event) over those launched so far."""
    ordered = events.filter(pl.col("launch_ns").is_not_null()).sort("launch_ns", "end_ns")
    running = pl.col("end_ns").cum_max().over(by)
    return ordered.with_columns(running.alias("_max_end")).with_columns(
        pl.when(pl.col("end_ns") == pl.col("_max_end")).then(pl.col("event_id")).forward_fill().over(by)
        .alias("_max_id")).select(*by, "launch_ns", "end_ns", "event_id", "_max_end", "_max_id")


def _host_waited(calls: pl.DataFrame, events: pl.DataFrame, by: list[str]) -> pl.Series:
    """waited_event_id of each call (in ``calls``' order) under the host_wait rule, matching events by ``by``."""
    if calls.is_empty():
        return pl.Series("waited_event_id", [], _I64)
    launched = _launched(events, by)
    calls = calls.with_row_index("_row").with_columns((pl.col("end_ns") + TOLERANCE_NS).alias("_limit"))
    # 1. the latest end among everything launched before the call, when it is within the call
    prefix = calls.sort("before_ns").join_asof(
        launched.select(*by, "launch_ns", "_max_end", "_max_id"), left_on="before_ns", right_on="launch_ns", by=by,
        strategy="backward", allow_exact_matches=False, check_sortedness=False)
    prefix = prefix.select("_row", pl.when(pl.col("_max_end") <= pl.col("_limit")).then(pl.col("_max_id"))
                           .alias("_prefix"))
    # 2. else (work launched before the call still ran after it returned: another stream) the latest end within
    # the call, if that event was launched before the call
    within = calls.sort("_limit").join_asof(
        launched.select(*by, pl.col("end_ns").alias("_end"), pl.col("launch_ns").alias("_launch"), "event_id")
        .sort("_end", "_launch"), left_on="_limit", right_on="_end", by=by, strategy="backward", check_sortedness=False)
    within = within.select("_row", pl.when(pl.col("_launch") < pl.col("before_ns")).then(pl.col("event_id"))
                           .alias("_within"))
    out = calls.select("_row").join(prefix, on="_row").join(within, on="_row").sort("_row")
    return out.select(pl.coalesce("_prefix", "_within").cast(_I64).alias("waited_event_id")).to_series()


def host_waits(calls: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (rank, name, start_ns, end_ns, stream or NULL, own_event_id or NULL, optional before_ns: the
    event record call's start) as host_wait rows of syncs; ``events`` the rank's device events (rank, event_id,
    stream, end_ns, launch_ns)."""
    events = events.select(pl.col("rank").cast(pl.Int32), pl.col("event_id").cast(_I64), pl.col("stream").cast(_I64),
                           pl.col("end_ns").cast(_I64), pl.col("launch_ns").cast(_I64))
    before = pl.coalesce(pl.col("before_ns").cast(_I64), "start_ns") if "before_ns" in calls.columns else \
        pl.col("start_ns")
    calls = calls.with_columns(pl.col("rank").cast(pl.Int32), pl.col("stream").cast(_I64),
                               before.alias("before_ns")).with_row_index("_order")
    parts = []
    for on_stream, by in ((True, ["rank", "stream"]), (False, ["rank"])):
        part = calls.filter(pl.col("stream").is_not_null() == on_stream)
        parts.append(part.with_columns(_host_waited(part, events, by)))
    out = pl.concat(parts).sort("_order").with_columns(
        pl.coalesce(pl.col("own_event_id").cast(_I64), "waited_event_id").alias("waited_event_id"))
    return out.select(pl.lit("host_wait").alias("kind"), pl.lit(None, _I64).alias("waiter_event_id"),
                      *[c for c in COLUMNS if c not in ("kind", "waiter_event_id")]).select(COLUMNS)


def _asof(waits: pl.DataFrame, events: pl.DataFrame, left: str, right: str, stream: str, forward: bool,
          exact: bool) -> pl.Series:
    """The event_id on each wait's ``stream`` column nearest ``left`` by the events' ``right``, in waits' order."""
    keyed = waits.with_row_index("_row").filter(pl.col(stream).is_not_null() & pl.col(left).is_not_null())
    if keyed.is_empty():  # (most exports have no stream waits: the events need no sorting then)
        return pl.Series("event_id", [None] * waits.height, _I64)
    found = keyed.sort(left).join_asof(
        events.select("rank", pl.col("stream").alias(stream), pl.col(right).alias("_key"), "event_id")
        .drop_nulls("_key").sort("_key"),
        left_on=left, right_on="_key", by=["rank", stream], strategy="forward" if forward else "backward",
        allow_exact_matches=exact, check_sortedness=False)
    return waits.with_row_index("_row").select("_row").join(found.select("_row", "event_id"), on="_row", how="left") \
        .sort("_row")["event_id"].cast(_I64)


def stream_waits(waits: pl.DataFrame, events: pl.DataFrame, *, device_times: bool) -> tuple[pl.DataFrame, SyncCounts]:
    """``waits`` (rank, name, start_ns, end_ns, stream: the waiting one, record_stream, record_ns: the record call's
    start or the record task's start) as stream_wait rows; either stream may be NULL (that edge stays NULL). A wait
    with neither edge says nothing a dependency graph can use (the table holds no stream): it is left out, counted
    by name."""
    events = events.select(pl.col("rank").cast(pl.Int32), pl.col("event_id").cast(_I64), pl.col("stream").cast(_I64),
                           *[pl.col(c).cast(_I64) for c in ("start_ns", "end_ns", "launch_ns")])
    waits = waits.with_columns(pl.col("rank").cast(pl.Int32),
                               *[pl.col(c).cast(_I64) for c in ("stream", "record_stream", "record_ns")])
    if device_times:
        waited = _asof(waits, events, "record_ns", "end_ns", "record_stream", forward=False, exact=True)
        waiter = _asof(waits, events, "end_ns", "start_ns", "stream", forward=True, exact=True)
    else:
        waited = _asof(waits, events, "record_ns", "launch_ns", "record_stream", forward=False, exact=False)
        waiter = _asof(waits, events, "start_ns", "launch_ns", "stream", forward=True, exact=False)
    rows = waits.with_columns(pl.lit("stream_wait").alias("kind"), waited.alias("waited_event_id"),
                              waiter.alias("waiter_event_id")).select(COLUMNS)
    edgeless = pl.col("waited_event_id").is_null() & pl.col("waiter_event_id").is_null()
    lost = rows.filter(edgeless).group_by("name").len().rows()
    return rows.filter(~edgeless), SyncCounts({f"{{n}} {name} stream waits left out: no device event found on either "
                                               "stream (the recorded stream unknown, no work on the waiting one after "
                                               "the wait)": n for name, n in lost})


@dataclass
class SyncCounts:
    """What a run's notes say about its syncs, added up over files: calls left out, and stored syncs without a
    waited event (so that nothing is missing silently)."""

    left_out: dict[str, int] = field(default_factory=dict)  # "N <what> left out: <why>" -> N
    unresolved: dict[str, int] = field(default_factory=dict)  # kind -> stored syncs whose waited event is unknown

    def __add__(self, other: SyncCounts) -> SyncCounts:
        def add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}

        return SyncCounts(add(self.left_out, other.left_out), add(self.unresolved, other.unresolved))

    def count(self, syncs: pl.DataFrame) -> SyncCounts:
        """These counts plus the unresolved waits of ``syncs`` (rows as stored)."""
        lost = syncs.filter(pl.col("waited_event_id").is_null()).group_by("kind").len()
        return self + SyncCounts(unresolved=dict(lost.sort("kind").iter_rows()))

    def notes(self) -> list[str]:
        notes = [what.replace("{n}", str(n)) for what, n in sorted(self.left_out.items()) if n]
        for kind, n in sorted(self.unresolved.items()):
            if n:
                notes.append(f"{n} syncs ({kind}) name no waited device event: none matched (waited_event_id NULL)")
        return notes
