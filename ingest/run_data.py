"""What every ingester returns: one run's tables in the store schema (minus ``run_id``), as :class:`RunData`.

The compact tables (ranks, groups, collectives, steps) are Polars frames. The bulky per-event tables may instead be
*spilled* (spill.py): written as Parquet by the worker that parsed each file, so that the run is never held in
memory; the cross-rank steps (dispatch.finish) then work on the collectives' own event times
(``RunData.comm_events``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceana.ingest.parallel.spill import Spill
    from traceana.ingest.validate import Dropped
    from traceana.layout import Layout

# Column name -> Polars dtype, per table, in store order (run_id is added by the store).
SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "ranks": {
        "rank": pl.Int32(), "host": pl.String(), "device": pl.Int32(), "pid": pl.Int64(),
        "clock_offset_ns": pl.Int64(), "tp": pl.Int32(), "cp": pl.Int32(), "ep": pl.Int32(), "dp": pl.Int32(),
        "pp": pl.Int32(), "rank_source": pl.String(), "source": pl.String(),
    },
    "process_groups": {
        "pg": pl.String(), "dim": pl.String(), "ranks": pl.List(pl.Int32()), "name": pl.String(),
        "source": pl.String(), "streams": pl.String(),
    },
    "device_events": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "stream": pl.Int64(), "start_ns": pl.Int64(),
        "end_ns": pl.Int64(), "name": pl.String(), "category": pl.String(), "launch_ns": pl.Int64(),
        "launch_thread": pl.Int64(),
    },
    "collectives": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "op": pl.String(), "kernel_op": pl.String(),
        "bytes": pl.Int64(), "dtype": pl.String(), "pg": pl.String(), "dim": pl.String(), "seq": pl.Int64(),
        "instance": pl.Int64(), "peer": pl.Int32(), "evidence": pl.String(),
    },
    "annotations": {
        "rank": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(),
        "domain": pl.String(), "kind": pl.String(), "args": pl.String(),
        "thread": pl.Int64(),
    },
    "steps": {"rank": pl.Int32(), "step": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64()},
    "memory": {"rank": pl.Int32(), "ts_ns": pl.Int64(), "allocated_bytes": pl.Int64(), "reserved_bytes": pl.Int64()},
    "syncs": {
        "rank": pl.Int32(), "kind": pl.String(), "name": pl.String(), "start_ns": pl.Int64(), "end_ns": pl.Int64(),
        "waited_event_id": pl.Int64(), "waiter_event_id": pl.Int64(),
    },
    "event_ops": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "op_id": pl.Int64(), "op": pl.String(), "input_dims": pl.String(),
        "input_types": pl.String(), "concrete_inputs": pl.String(),
    },
    "event_scopes": {
        "rank": pl.Int32(), "event_id": pl.Int64(), "op": pl.String(), "module": pl.String(), "nvtx": pl.String(),
        "phase": pl.String(),
    },
}
TABLES = tuple(SCHEMAS)
TIME_COLUMNS = {"device_events": ("start_ns", "end_ns", "launch_ns"), "annotations": ("start_ns", "end_ns"),
                "steps": ("start_ns", "end_ns"), "memory": ("ts_ns",), "syncs": ("start_ns", "end_ns"),
                "event_ops": (), "event_scopes": ()}
# the tables that grow with events: written per file
SPILLED = ("device_events", "annotations", "memory", "syncs", "event_ops", "event_scopes")


def conform(table: str, frame: pl.DataFrame | None) -> pl.DataFrame:
    """``frame`` with exactly the store columns of ``table`` (missing ones NULL, extra ones dropped), cast."""
    schema = SCHEMAS[table]
    if frame is None:
        return pl.DataFrame(schema=schema)
    return frame.select(
        [(pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c) for c, t in schema.items()]
    )


@dataclass
class RunData:
    """One run, parsed. Frames may omit columns; :func:`conform` fills them when the store writes. With a
    :class:`Spill`, its tables are not in ``frames`` and ``comm_events`` holds the (rank, event_id, stream,
    start_ns, end_ns) of the collectives' device events, all the cross-rank steps read of them."""

    source_format: str
    sources: list[str]
    world_size: int
    tool_version: str | None = None
    rank_source: str | None = None
    notes: list[str] = field(default_factory=list)
    device: str | None = None  # the device model the trace names ('NVIDIA H200'; several: comma-separated)
    frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    layout: Layout | None = None  # the user's --layout, else one the trace states (MindSpeed distributed_args)
    spill: Spill | None = None
    comm_events: pl.DataFrame | None = None
    dropped: Dropped | None = None  # what validation left out of the rows spilled by the workers

    def table(self, name: str) -> pl.DataFrame:
        """The whole table as a frame (for a spilled one, read back from its Parquet in the order of its columns,
        whatever the parts' names: tests and small runs)."""
        if self.spill is not None and name in SPILLED:
            pattern = self.spill.glob(name)
            if pattern is None:
                return conform(name, None)
            import duckdb

            with duckdb.connect() as con:
                con.register("spill_parts", self.spill.parts.to_arrow())
                return conform(name, con.sql(f"{self.spill.select_sql(name, pattern)} ORDER BY ALL").pl())
        return conform(name, self.frames.get(name))

    def device_times(self) -> pl.DataFrame:
        """(rank, event_id, stream, start_ns, end_ns) of at least every collective's device event."""
        if self.comm_events is not None:
            return self.comm_events
        return self.table("device_events").select("rank", "event_id", "stream", "start_ns", "end_ns")

    def discard(self) -> None:
        """Remove the spilled Parquet and let the frames go (the run is in the store, or will never be): a dataset
        writes its files after this, and thousands of ranks' frames would wait in memory beside that."""
        if self.spill is not None:
            self.spill.remove()
        self.frames, self.comm_events = {}, None
