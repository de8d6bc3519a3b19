"""The checks every format shares, applied to each parsed run before the shared ``finish`` step and the store.

Readers parse; what no store row may be (a NULL time or name, an interval that ends before it starts, a time no
clock produces, a rank no INTEGER holds) is decided here once. Rows that cannot be stored are dropped with a note
that counts them; a rank that cannot be represented is a one-line error, since the run would be wrong without it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.run_data import SCHEMAS, TIME_COLUMNS, RunData, conform

MAX_RANK = 2**31 - 1  # ranks are INTEGER in the store
SENTINEL_RANKS = (-1, 4294967295, 2**64 - 1)  # "no rank": -1 as int32, uint32, uint64
# Timestamps are ns since some epoch (Unix or boot): 0 .. 2^62 (year 2116) holds every clock a profiler uses, and
# leaves room for the shared step's clock shifts without overflow. Anything outside is a damaged value.
MAX_TIME_NS = 2**62
# A profile covers seconds to hours: a time more than a day from the median of its rank's times is a damaged value
# (ts -1e15 us on a trace with a wall-clock base still lands in 1989), not an event of this run.
MAX_SPREAD_NS = 86_400 * 10**9
MAX_BYTES = 2**50  # 1 PiB: more than any one message of any collective
# Store columns that are NOT NULL (besides run_id and rank, which readers always set).
REQUIRED = {table: [c for c in ("start_ns", "end_ns", "ts_ns", "name", "category", "kind", "step", "event_id")
                     if c in schema]
            for table, schema in SCHEMAS.items()}


def checked_rank(value: object, source: str, field: str) -> int | None:
    """A rank a trace states: None when absent or a "no rank" sentinel, else an int the store holds, else a
    one-line error naming the source, the field and the value."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value in SENTINEL_RANKS:
            return None
        if 0 <= value <= MAX_RANK:
            return value
    raise TraceanaError(f"{source}: {field} is {value!r}, not a rank (an integer 0 .. {MAX_RANK})")


def rank_list(value: object, source: object, field: str) -> list[int]:
    """Group members as a trace writes them (a list, "[0, 1]" or "0,1"; absent or "" = none) as sorted ranks."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text if text.startswith("[") else f"[{text}]")
        except ValueError:
            raise TraceanaError(f"{source}: {field} {text[:60]!r} is not a list of ranks") from None
    if value is not None and not isinstance(value, list):
        raise TraceanaError(f"{source}: {field} {json.dumps(value)[:60]} is not a list of ranks")
    ranks = []
    for member in value or []:
        if isinstance(member, str) and member.strip().isdigit():
            member = int(member)
        rank = checked_rank(member, str(source), field) if isinstance(member, int) else None
        if rank is None:
            raise TraceanaError(f"{source}: {field} {json.dumps(value)[:60]} is not a list of ranks")
        ranks.append(rank)
    return sorted(ranks)


@dataclass
class Dropped:
    """What validation left out or read as unknown, counted, so that parts validated apart (each file in its worker)
    add up to the notes the whole run validated at once gives."""

    rows: dict[str, int] = field(default_factory=dict)  # table -> rows left out
    reasons: dict[str, set[str]] = field(default_factory=dict)  # table -> why (labels of _conditions)
    repeated: dict[str, int] = field(default_factory=dict)  # table -> rows repeating a key
    sizes: int = 0  # collectives whose size was read as unknown
    launches: int = 0  # device events whose launch time was read as unknown

    def __add__(self, other: Dropped) -> Dropped:
        def add(a: dict, b: dict) -> dict:
            return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}

        reasons = {k: self.reasons.get(k, set()) | other.reasons.get(k, set())
                   for k in {**self.reasons, **other.reasons}}
        return Dropped(add(self.rows, other.rows), reasons, add(self.repeated, other.repeated),
                       self.sizes + other.sizes, self.launches + other.launches)

    def notes(self) -> list[str]:
        out = []
        for table in _ROW_TABLES:
            if count := self.rows.get(table):
                order = [label for _, label in _conditions(table, SCHEMAS[table])]
                why = ", ".join(sorted(self.reasons[table], key=order.index))
                out.append(f"{count} {table.replace('_', ' ')} rows left out ({why})")
        for table, key in _KEYS.items():
            if repeated := self.repeated.get(table):
                out.append(f"{repeated} {table.replace('_', ' ')} rows repeat a {'/'.join(key)} of another; "
                           "the first is kept")
        if self.sizes:
            out.append(f"{self.sizes} collectives have a message size outside 0 .. 2^50 bytes; read as unknown")
        if self.launches:
            out.append(f"{self.launches} device events have a launch time outside 0 .. 2^62 ns; read as unknown")
        return out


_ROW_TABLES = ("device_events", "annotations", "steps", "memory", "syncs")
_KEYS = {"process_groups": ["pg"], "steps": ["rank", "step"]}


def validate(data: RunData, earlier: Dropped | None = None) -> RunData:
    """Drop the rows of ``data`` that no store row may be, with one note per table saying how many and why (adding
    what the workers that read its files dropped, ``earlier``)."""
    data.notes += (check(data) + (earlier or Dropped())).notes()
    return data


def check(data: RunData) -> Dropped:
    """:func:`validate` without the notes: the rows are dropped, the counts returned."""
    dropped = Dropped()
    ranks = data.table("ranks")
    if (bad := ranks.filter((pl.col("rank") < 0) | pl.col("rank").is_null())).height:
        raise TraceanaError(f"{ranks['source'][0]}: rank {bad['rank'][0]} is not a rank (an integer 0 .. {MAX_RANK})")
    for table in _ROW_TABLES:
        frame = data.frames.get(table)
        if frame is None or frame.is_empty():
            continue
        frame = conform(table, frame) if set(SCHEMAS[table]) - set(frame.columns) else frame
        reasons = _reasons(table, frame)
        if not reasons:
            continue
        bad = pl.any_horizontal([cond for cond, _ in reasons])
        count = frame.select(bad.sum()).item()
        data.frames[table] = frame.filter(~bad)
        dropped.rows[table] = count
        dropped.reasons[table] = {label for _, label in reasons}
    for table, key in _KEYS.items():
        dropped.repeated[table] = _unique(data, table, key)
    _drop_orphans(data)
    _unlink_lost_events(data)
    dropped.sizes = _unknown_sizes(data)
    dropped.launches = _unknown_launches(data)
    return dropped


def _unlink_lost_events(data: RunData) -> None:
    """A sync whose waited or waiter device event was left out keeps its row (the wait happened) but loses that
    edge: an id must point at a stored event of its rank."""
    syncs, events = data.frames.get("syncs"), data.frames.get("device_events")
    if syncs is None or syncs.is_empty() or events is None:
        return
    syncs = conform("syncs", syncs)
    columns = ("waited_event_id", "waiter_event_id")
    events = events.select(pl.col("rank").cast(pl.Int32), pl.col("event_id").cast(pl.Int64))
    named = pl.concat([syncs[c] for c in columns]).drop_nulls()  # a few ids: only those events are looked up
    stored = events.filter(pl.col("event_id").is_in(named.implode())).unique().with_columns(_stored=pl.lit(True))
    for column in columns:
        syncs = syncs.join(stored.rename({"event_id": column}), on=["rank", column], how="left",
                           maintain_order="left").with_columns(
            pl.when(pl.col("_stored")).then(pl.col(column)).alias(column)).drop("_stored")
    data.frames["syncs"] = syncs


def _unknown_launches(data: RunData) -> int:
    """A launch time no clock produces is read as unknown: the event itself is good, only the host call's time
    (optional: the idle and step analyses use it where present) is damaged."""
    events = data.frames.get("device_events")
    if events is None or "launch_ns" not in events.columns:
        return 0
    absurd = ~pl.col("launch_ns").is_between(0, MAX_TIME_NS)
    if count := events.select(absurd.fill_null(False).sum()).item():
        data.frames["device_events"] = events.with_columns(
            pl.when(absurd).then(None).otherwise(pl.col("launch_ns")).alias("launch_ns"))
    return count


def _unique(data: RunData, table: str, key: list[str]) -> int:
    """Rows repeating a primary key (the same group id or step number twice) keep the first."""
    frame = data.frames.get(table)
    if frame is None or frame.is_empty() or not set(key) <= set(frame.columns):
        return 0
    unique = frame.unique(key, keep="first", maintain_order=True)
    if repeated := frame.height - unique.height:
        data.frames[table] = unique
    return repeated


def _unknown_sizes(data: RunData) -> int:
    """A message size below 0 or above 2^50 bytes (uint64 -1 written as -1 and multiplied by the element size, or
    a product that wrapped) is no size a collective moves: it is read as unknown."""
    coll = data.frames.get("collectives")
    if coll is None or "bytes" not in coll.columns:
        return 0
    absurd = ~pl.col("bytes").is_between(0, MAX_BYTES)
    if count := coll.select(absurd.fill_null(False).sum()).item():
        data.frames["collectives"] = coll.with_columns(pl.when(absurd).then(None).otherwise(pl.col("bytes"))
                                                       .alias("bytes"))
    return count


def _conditions(table: str, columns: Collection[str]) -> list[tuple[pl.Expr, str]]:
    """(condition that makes a row unstorable, what to call it), for a frame of ``table`` with ``columns``."""
    conditions: list[tuple[pl.Expr, str]] = []
    for column in REQUIRED[table]:
        conditions.append((pl.col(column).is_null(), f"no {column}"))
    times = [c for c in TIME_COLUMNS[table] if c in REQUIRED[table]]  # launch_ns is optional: _unknown_launches
    by = "rank" if "rank" in columns else None
    median = pl.col(times[0]).median().over(by) if by else pl.col(times[0]).median()
    conditions.append((pl.any_horizontal([~pl.col(c).is_between(0, MAX_TIME_NS) for c in times]),
                       "a time outside 0 .. 2^62 ns"))
    conditions.append((pl.any_horizontal([(pl.col(c) - median).abs() > MAX_SPREAD_NS for c in times]),
                       "a time more than a day from the rank's others"))
    if "end_ns" in times:
        conditions.append((pl.col("end_ns") < pl.col("start_ns"), "end before start"))
    if "rank" in columns:
        conditions.append((pl.col("rank").is_null(), "no rank"))
    if table == "steps":  # numbers from marker names ("ProfilerStep#99999999999") must fit the store's INTEGER
        conditions.append((~pl.col("step").is_between(0, MAX_RANK), "a step number outside 0 .. 2^31"))
    return conditions


def _reasons(table: str, frame: pl.DataFrame) -> list[tuple[pl.Expr, str]]:
    """The :func:`_conditions` that hold on some row of ``frame``."""
    conditions = _conditions(table, frame.columns)
    present = frame.select([cond.fill_null(False).any().alias(str(i)) for i, (cond, _) in enumerate(conditions)])
    return [(cond.fill_null(False), label) for (cond, label), hit in zip(conditions, present.row(0), strict=True)
            if hit]


def _drop_orphans(data: RunData) -> None:
    """Collectives whose device event was left out go too (they point at it); the note above counted the events."""
    coll, events = data.frames.get("collectives"), data.frames.get("device_events")
    if coll is None or coll.is_empty() or events is None or "event_id" not in coll.columns:
        return
    kept = coll.join(events.select("rank", "event_id"), on=["rank", "event_id"], how="semi")
    if kept.height < coll.height:
        data.frames["collectives"] = kept
