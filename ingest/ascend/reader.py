"""Ascend profiler output (torch_npu, MindSpore, msprof) as one run: read each rank's input (database export,
timeline JSON, or kernel_details.csv where the timeline was left out), number the ranks, tell hosts apart, and
link HCCL ops to their communicators and dimensions.

Ranks come from the folder (profiler_info_{rank}.json, a PROF device's rank_id), the database's RANK_DEVICE_MAP,
a database file's name, else device or input order. Text exports carry no host name: ranks whose profiler
recorded the same wall-minus-monotonic clock offset (the host's boot time) share a host. A layout comes from
--layout, else from MindSpeed's ``distributed_args`` in the metadata.

Each rank folder is read on its own (:func:`parse_rank`, in a worker with --jobs): its events are numbered and
validated there, and its device events, annotations and memory samples spilled as Parquet (spill.Spill); only
ranks, hosts and communicators are decided across folders, on the HCCL ops' rows. Steps are the rank's own
(STEP_TIME, else its step markers' ranges).
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl

from traceana.ingest.ascend.database import read_database
from traceana.ingest.ascend.groups import (
    checked_metadata,
    communication_keys,
    double_hash,
    layout_from_metadata,
    link_by_hash,
    metadata_groups,
)
from traceana.ingest.ascend.inputs import RankInput, find_inputs, is_ascend, is_output_folder
from traceana.ingest.ascend.kernels import read_kernel_details
from traceana.ingest.ascend.syncs import rank_syncs
from traceana.ingest.ascend.tasks import RankTrace
from traceana.ingest.ascend.timeline import read_timeline
from traceana.ingest.dispatch import IngestOptions
from traceana.ingest.parallel.executor import map_files, worker_count
from traceana.ingest.parallel.spill import Spill, new_spill, spill_file
from traceana.ingest.ranks import require_unique_ranks
from traceana.ingest.rules import Rule
from traceana.ingest.run_data import RunData
from traceana.ingest.syncs.edges import SyncCounts
from traceana.ingest.validate import Dropped
from traceana.layout import Layout

_HOST_CLOCK_TOLERANCE_NS = 1_000_000  # ranks of one host record the same wall-minus-monotonic offset to a few µs


def matches(path: Path) -> bool:
    """A profiler / PROF folder, a folder of them, a database export, or an Ascend timeline JSON."""
    return is_ascend(path)


def is_unit(path: Path) -> bool:
    """Whether ``path`` is one Ascend output, whatever other formats' names its files have (dispatch.detect)."""
    return path.is_dir() and is_output_folder(path)


def _read_rank(source: RankInput, rules: list[Rule], marker: str | None) -> RankTrace:
    """One rank's trace, with what its folder said (rank, level, metadata, op@hash links) folded in."""
    if source.kind == "db":
        trace = read_database(source.files[0], rules, marker)
    elif source.kind == "kernels":
        trace = read_kernel_details(source.files[0], source.communication, rules)
    else:
        trace = read_timeline(source.files, rules, marker)
    trace.source = source.origin
    if source.rank is not None:
        trace.rank, trace.rank_source = source.rank, source.rank_source
    trace.boot_ns = source.boot_ns
    trace.tool_version = ", ".join(filter(None, [f"profiler {source.level}" if source.level else None,
                                                 trace.tool_version])) or None
    trace.metadata = checked_metadata({**trace.metadata, **source.metadata})
    if source.communication is not None and source.kind == "timeline":
        trace.events = link_by_hash(trace.events, communication_keys(source.communication))
    return trace


@dataclass
class ParsedRank:
    """What reading one rank folder gives back to the run: its trace without the per-event tables, which went to
    the spill folder as part ``key`` (``trace.events`` keeps only the HCCL ops, with their event ids)."""

    key: str
    trace: RankTrace
    dropped: Dropped
    sync_counts: SyncCounts  # stream waits left out, syncs whose waited event is unknown


def parse_rank(source: RankInput, *, rules: list[Rule], marker: str | None, spill: Path) -> ParsedRank:
    """Everything about one rank folder that needs no other rank (in a worker process with --jobs): parse, event
    ids, validation; device events, annotations and memory samples are written to ``spill``."""
    trace = _read_rank(source, rules, marker)
    rank = pl.lit(0, dtype=pl.Int32()).alias("rank")  # the rank is decided across folders: the part key stands in
    events = trace.events.sort("start_ns", "end_ns", "name").with_columns(
        rank, pl.int_range(pl.len(), dtype=pl.Int64).alias("event_id"))
    syncs, sync_counts = rank_syncs(events, trace.annotations)
    frames, key, dropped = spill_file(spill, "ascend", str(source.origin), {
        "device_events": events, "syncs": syncs,
        "collectives": events.filter((pl.col("category") == "comm") & pl.col("kernel_op").is_not_null()),
        "annotations": trace.annotations.with_columns(rank),
        "steps": trace.steps.with_columns(rank),  # STEP_TIME or marker
        **({"memory": trace.memory.with_columns(rank)} if trace.memory is not None else {}),
    })
    trace.events = frames["collectives"].drop("rank")
    trace.steps = frames["steps"].drop("rank")
    trace.annotations, trace.memory = trace.annotations.clear(), None
    return ParsedRank(key, trace, dropped, sync_counts.count(frames["syncs"]))


def _number_ranks(traces: list[RankTrace]) -> None:
    """Ranks for traces that do not state one: by device id when every trace has a distinct one, else input order."""
    devices = [t.device for t in traces]
    by_device = None not in devices and len(set(devices)) == len(devices)
    order = sorted(range(len(traces)), key=lambda i: devices[i]) if by_device else range(len(traces))
    taken = {t.rank for t in traces}
    free = (r for r in itertools.count() if r not in taken)
    for index in order:
        if traces[index].rank is None:
            traces[index].rank = next(free)
            traces[index].rank_source = "device-order" if by_device else "input-order"


def _name_hosts(traces: list[RankTrace], notes: list[str]) -> None:
    """Hosts for traces without a host name: one per cluster of clock offsets (the host's boot time)."""
    start = None
    unnamed = [t for t in traces if t.host is None and t.boot_ns is not None]
    for trace in sorted(unnamed, key=lambda t: t.boot_ns or 0):
        if start is None or (trace.boot_ns or 0) - start > _HOST_CLOCK_TOLERANCE_NS:
            start = trace.boot_ns or 0
        trace.host = "booted " + dt.datetime.fromtimestamp(start / 1e9, dt.UTC).isoformat(timespec="milliseconds")
    if unnamed:
        notes.append("hosts told apart by the profiler's wall-minus-monotonic clock offset (text exports name no host)")


def _collectives(comm: pl.DataFrame, groups: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """HCCL op rows with their pg, and the process groups: parallel_group_info's, then communicators only seen
    in ops (their ranks: the ranks that ran ops in them)."""
    by_hash = {double_hash(pg): pg for pg in groups["pg"].to_list()}
    comm = comm.with_columns(
        pl.coalesce("comm", pl.col("group_hash").replace_strict(by_hash, default=None, return_dtype=pl.String()),
                    pl.col("group_hash").cast(pl.String())).alias("pg"),
    ).with_columns(pl.when(pl.col("pg").is_not_null()).then(pl.lit("pg-args")).otherwise(pl.lit("name-rule"))
                   .alias("evidence"))
    seen = (comm.filter(pl.col("pg").is_not_null() & ~pl.col("pg").is_in(groups["pg"].implode()))
            .group_by("pg").agg(pl.col("rank").unique().sort().cast(pl.Int32).alias("ranks")))
    return comm, pl.concat([groups.with_columns(source=pl.lit("trace")),
                            seen.with_columns(name=pl.lit(None, dtype=pl.String()), source=pl.lit("inferred"))],
                           how="diagonal_relaxed")


def _metadata_layout(metadata: list[dict], world: int, notes: list[str]) -> Layout | None:
    layout = layout_from_metadata(metadata)
    if layout is None:
        return None
    if layout.world_size != world:
        notes.append(f"MindSpeed distributed_args layout {layout.spec} ignored: it has {layout.world_size} ranks, the "
                     f"run {world}")
        return None
    layout.validate()
    notes.append(f"layout {layout.spec} from MindSpeed distributed_args")
    return layout


def read(paths: list[Path], options: IngestOptions) -> RunData:
    """One run from Ascend profiler output: each rank folder read on its own (:func:`parse_rank`, across
    ``options.jobs`` workers), then ranks, hosts and communicators across the folders' small parts."""
    notes: list[str] = []
    inputs = find_inputs(paths, notes)
    if without := sum(source.kind == "kernels" for source in inputs):
        notes.append(f"{without} of {len(inputs)} ranks have no trace_view.json: read from kernel_details.csv (and "
                     "communication.json where there is one), so there is no host side (CPU ops, launches, step markers"
                     f"{': --step-marker is not applied' if options.step_marker else ''}), no memcpy or event tasks "
                     "(no syncs) and no HCCL plane tasks; each step spans its first to last device task")
    files = [f for source in inputs for f in source.files]
    options.progress.files(files)
    with new_spill(options.spill_near) as spill:
        task = partial(parse_rank, rules=options.rules, marker=options.step_marker, spill=spill.folder)
        jobs = worker_count(options.jobs, files)  # a rank folder may hold several files: one worker per folder
        jobs = min(jobs, len(inputs)) if isinstance(jobs, int) else jobs
        parsed = []
        for source, rank in zip(inputs, map_files(task, inputs, jobs), strict=True):
            parsed.append(rank)
            for file in source.files:
                options.progress.read(file)
        return _run(inputs, parsed, spill, notes, options)


def _run(inputs: list[RankInput], parsed: list[ParsedRank], spill: Spill, notes: list[str],
         options: IngestOptions) -> RunData:
    options.progress.phase("numbering ranks and matching collectives")
    traces = [p.trace for p in parsed]
    _number_ranks(traces)
    require_unique_ranks([t.rank for t in traces], [str(t.source) for t in traces])
    _name_hosts(traces, notes)
    notes.extend(note for t in traces for note in t.notes)
    notes.extend(sum((p.sync_counts for p in parsed), SyncCounts()).notes())

    def with_rank(frame: pl.DataFrame, trace: RankTrace) -> pl.DataFrame:
        return frame.with_columns(rank=pl.lit(trace.rank, dtype=pl.Int32()))

    ops = pl.concat([with_rank(t.events, t) for t in traces]).sort("rank", "event_id")
    metadata = [t.metadata for t in traces]
    comm, groups = _collectives(ops, metadata_groups(metadata))
    if comm["pg"].null_count():
        notes.append(f"{comm['pg'].null_count()} HCCL ops have no communicator evidence (no database groupName, no "
                     f"communication.json op@hash: profiler level 0?); their process group is unknown")

    world = max([max(t.rank for t in traces) + 1]
                + [m["distributed_args"].get("world_size") or 0 for m in metadata])
    ranks = pl.DataFrame(
        [{"rank": t.rank, "host": t.host, "device": t.device, "pid": t.pid, "rank_source": t.rank_source,
          "source": str(t.source)} for t in traces],
        schema={"rank": pl.Int32(), "host": pl.String(), "device": pl.Int32(), "pid": pl.Int64(),
                "rank_source": pl.String(), "source": pl.String()})
    spill.parts = pl.DataFrame({"key": [p.key for p in parsed], "rank": [t.rank for t in traces],
                                "shift": [0] * len(parsed)}, schema=spill.parts.schema)
    layout = None if options.layout else _metadata_layout(metadata, world, notes)
    return RunData(
        source_format="ascend",
        sources=[str(f.resolve()) for source in inputs for f in source.files],
        world_size=world,
        tool_version="; ".join(sorted({t.tool_version for t in traces if t.tool_version})) or None,
        rank_source=",".join(sorted({t.rank_source for t in traces if t.rank_source})),
        notes=notes,
        layout=layout,
        frames={"ranks": ranks, "process_groups": groups, "collectives": comm,
                "steps": pl.concat([with_rank(t.steps, t) for t in traces], how="vertical_relaxed")},
        spill=spill,
        comm_events=comm.select("rank", "event_id", "stream", "start_ns", "end_ns"),
        dropped=sum((p.dropped for p in parsed), Dropped()),
    )
