"""Nsight Systems ingest: SQLite exports (nsys 2022.x ... 2026.x) and .nsys-rep reports, one or many per run.

A run is one report holding every process (torchrun under nsys), or one report per rank, or a folder of them.
Each process and device with GPU activity is one rank; a report without GPU activity (a CPU-only capture) gives
one rank per process with NVTX ranges. Ranks come, in order, from what the process states (MPI_RANKS, an
"MPI Rank N" thread name, RANK / OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID / LOCAL_RANK in the captured
environment of a one-process report), then from the rank each report's file name states (rank3, rank_3, _r3_,
worker3; other digits are not ranks), then from device order; ``rank_source`` records which. A process that drives
several GPUs is one rank per device, with a note. Reports are aligned coarsely by their session start
(utcEpochNs), recorded in ranks.clock_offset_ns; refining cross-host skew by collective end times is left to the
shared ``finish`` step, not done here.

Kernels, memcpys and memsets become device_events (report.py; kernel names through StringIds: the short name is
the demangled name kept); NVTX push/pop and start/end ranges become annotations, with the name
``COALESCE(text, StringIds[textId])`` and the domain from the process's domain-create rows. An export with no
kernel table is ingested with a note (no device activity); one with neither GPU activity nor NVTX ranges is
refused. CUDA synchronization records are host-side waits, not device work: they become syncs (syncs.py).

Each report is read on its own (:func:`parse_report`, in a worker with --jobs): its units' events are numbered,
step-windowed and validated there, and their device events and NVTX ranges spilled as Parquet (spill.Spill);
only ranks, clocks and the collectives' event times are decided across reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.clocks import require_overlapping_clocks
from traceana.ingest.nsys.export import Export, is_sqlite
from traceana.ingest.nsys.report import read_report
from traceana.ingest.nsys.syncs import resolve
from traceana.ingest.parallel.executor import map_files, worker_count
from traceana.ingest.parallel.spill import Spill, new_spill, spill_file
from traceana.ingest.ranks import rank_in_file_name, require_distinct, require_unique_ranks
from traceana.ingest.rules import Rule
from traceana.ingest.run_data import RunData
from traceana.ingest.scopes import SWEEP_CONFIG, open_ranges_sql
from traceana.ingest.step_windows import StepLinks, marker_steps, step_windows_of
from traceana.ingest.syncs.edges import SyncCounts
from traceana.ingest.validate import Dropped

if TYPE_CHECKING:
    from traceana.ingest.dispatch import IngestOptions

# ProfilerStep#N and common iteration / step range names ("train_step 3", "iteration 12", "step_4").
DEFAULT_STEP_MARKER = r"(?i)^(ProfilerStep#\d+|(train(ing)?[ _-]?)?(step|iteration|iter)[ _#-]*\d+)$"
_I64 = pl.Int64()
_STR = pl.String()


def matches(path: Path) -> bool:
    """A .nsys-rep, an SQLite export, or a folder holding either."""
    if path.is_dir():
        return any(_is_report(p) for p in path.iterdir())
    if path.suffix in (".nsys-rep", ".sqlite", ".sqlite3"):
        return True
    return is_sqlite(path) and _has_nsys_tables(path)


def _is_report(path: Path) -> bool:
    """A file a folder holds for this reader, by its name: one that then cannot be read is an error naming it, never
    a rank left out."""
    return path.is_file() and path.suffix in (".nsys-rep", ".sqlite")


def _has_nsys_tables(path: Path) -> bool:
    try:
        export = Export(path)
    except TraceanaError:
        return False
    export.close()
    return True


def _natural(path: Path) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _inputs(paths: list[Path]) -> list[Path]:
    """Every report file the paths name, in natural order (rank_10 after rank_2); none twice."""
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            raise TraceanaError(f"{path}: no such file or directory")
        if path.is_dir():
            found = [p for p in path.iterdir() if _is_report(p)]
            exported = {p.stem for p in found if p.suffix == ".sqlite"}
            found = [p for p in found if p.suffix == ".sqlite" or p.stem not in exported]  # prefer the export
            if not found:
                raise TraceanaError(f"{path}: no .sqlite export or .nsys-rep report in this folder")
            files.extend(found)
        else:
            files.append(path)
    require_distinct(files)
    return sorted(files, key=_natural)


def _assign_ranks(units: pl.DataFrame, reports: list[ParsedReport]) -> pl.DataFrame:
    """units (report, unit, pid, device, stated_rank, stated_source) -> with rank and rank_source."""
    sources = [str(reports[i].source) for i in units["report"]]
    stated = units["stated_rank"]
    if stated.null_count() == 0:
        if stated.n_unique() == len(units):
            return units.with_columns(pl.col("stated_rank").alias("rank"), pl.col("stated_source").alias("rank_source"))
        per_file = units.with_columns(pl.Series("_source", sources)).unique(["_source", "stated_rank"])
        require_unique_ranks(per_file["stated_rank"].to_list(), per_file["_source"].to_list())
    numbers = [rank_in_file_name(r.source.name) for r in reports]
    if len(reports) > 1 and len(units) == len(reports) and None not in numbers and len(set(numbers)) == len(numbers):
        return units.with_columns(pl.col("report").replace_strict(dict(enumerate(numbers)), return_dtype=_I64)
                                  .alias("rank"), pl.lit("file-name").alias("rank_source"))
    order = "device-order" if units["device"].null_count() == 0 else "process-order"
    return units.sort("report", "stated_rank", "device", "pid", nulls_last=True).with_row_index("rank").with_columns(
        pl.col("rank").cast(_I64), pl.lit(order).alias("rank_source")
    )


def _clock_offsets(reports: list[ParsedReport], notes: list[str]) -> list[int]:
    """Per report, ns to add to reach the run timeline: session starts (utcEpochNs) relative to the earliest."""
    starts = [r.session_start for r in reports]
    if len(reports) == 1:
        return [0]
    if None in starts:
        lacking = ", ".join(r.source.name for r in reports if r.session_start is None)
        notes.append(f"no session start time in {lacking}: reports are not clock-aligned")
        return [0] * len(reports)
    first = min(s for s in starts if s is not None)
    return [s - first for s in starts if s is not None]


@dataclass
class ParsedReport:
    """What reading one report gives back to the run: everything but its device events and NVTX ranges, which went
    to the spill folder, one part per unit (process, device) named ``<key>-<unit>``. ``unit`` stands for the rank
    until the run decides ranks across reports; times are the report's own clock."""

    source: Path
    key: str
    units: pl.DataFrame        # unit, pid, device, stated_rank, stated_source
    collectives: pl.DataFrame  # unit, event_id, op, kernel_op, dtype, evidence, stream, start_ns, end_ns
    steps: pl.DataFrame        # unit, step, start_ns, end_ns
    links: StepLinks           # unlinked: units
    has_events: bool
    span: tuple[int, int] | None  # first and last ns of its events and ranges: reports of one run overlap
    unowned: int               # NVTX ranges of processes without GPU activity, left out
    dropped: Dropped
    sync_counts: SyncCounts    # sync rows left out, syncs whose waited event is unknown
    host: str | None
    session_start: int | None
    version: str | None
    notes: list[str]


def parse_report(source: Path, *, cache_dir: Path, rules: list[Rule], marker: str, spill: Path) -> ParsedReport:
    """Everything about one report that needs no other report (in a worker process with --jobs): parse, event ids,
    the units' step windows, validation; device events and NVTX ranges are written to ``spill``."""
    report = read_report(source, cache_dir, rules)
    units = report.units.with_row_index("unit").with_columns(pl.col("unit").cast(_I64))
    keys = units.select("pid", "device", pl.col("unit").alias("rank"))
    device = report.device.join(keys, on=["pid", "device"], nulls_equal=True)
    # a stable sort, so that events tied on all four keys get the same ids on every ingest
    device = device.sort("rank", "start_ns", "end_ns", "stream", maintain_order=True).with_columns(
        pl.int_range(pl.len()).over("rank").cast(_I64).alias("event_id"))
    owners = keys.select("pid", "rank")
    annotations = report.ranges.join(owners, on="pid", nulls_equal=True)  # a multi-GPU process: every rank
    unowned = report.ranges.join(owners, on="pid", how="anti", nulls_equal=True).height
    annotations = annotations.with_columns(pl.lit("nvtx").alias("kind"), pl.col("tid").alias("thread")).sort(
        "rank", "start_ns")
    span = pl.concat([f.select("start_ns", "end_ns") for f in (device, annotations)]).select(
        pl.col("start_ns").min(), pl.col("end_ns").max()).row(0)
    steps, links = step_windows_of(device, marker_steps(annotations, marker))
    syncs, sync_counts = resolve(report.syncs, device, keys)
    frames, key, dropped = spill_file(spill, "nsys", str(source), {
        "device_events": device, "annotations": annotations, "steps": steps, "syncs": syncs,
        "event_scopes": _nvtx_scopes(device, report.ranges)}, per_rank=True)
    device = frames["device_events"]
    return ParsedReport(
        source, key, units, device.filter(pl.col("op").is_not_null()).select(
            pl.col("rank").alias("unit"), "event_id", "op", "kernel_op", "dtype", "evidence", "stream", "start_ns",
            "end_ns"),
        frames["steps"].rename({"rank": "unit"}), links, not device.is_empty(),
        span if span[0] is not None else None, unowned, dropped, sync_counts.count(frames["syncs"]),
        report.host, report.session_start, report.version, report.notes)


def _nvtx_scopes(device: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """event_scopes' nvtx: the NVTX ranges open on each event's launching thread when its runtime call ran, as a
    path outermost first (ingest/scopes.py), a named domain's range as 'domain:name' so domains stay apart."""
    con = duckdb.connect(config=SWEEP_CONFIG)
    con.register("device", device.select("rank", "event_id", "pid", "launch_thread", "launch_ns", "correlationId"))
    con.register("nvtx", ranges.select("pid", "tid", "start_ns", "end_ns", "name", "domain"))
    ranges_sql = ("(SELECT pid, tid, start_ns, end_ns, CASE WHEN domain IS NULL THEN name "
                  "ELSE domain || ':' || name END AS name FROM nvtx)")
    points = ("(SELECT DISTINCT pid, launch_thread AS tid, launch_ns AS t, correlationId AS id FROM device "
              "WHERE launch_ns IS NOT NULL)")
    return con.sql(f"""SELECT d.rank, d.event_id, s.path AS nvtx
        FROM ({open_ranges_sql(ranges_sql, points, "pid, tid")}) s
        JOIN device d ON d.pid = s.pid AND d.correlationId = s.id""").pl()


def read(paths: list[Path], options: IngestOptions) -> RunData:
    """One run from nsys exports / reports (files, or folders of them): each report read on its own
    (:func:`parse_report`, across ``options.jobs`` workers), then ranks and clocks across the reports' small parts."""
    sources = _inputs(paths)
    options.progress.files(sources)
    with new_spill(options.spill_near) as spill:
        task = partial(parse_report, cache_dir=options.cache_dir, rules=options.rules,
                       marker=options.step_marker or DEFAULT_STEP_MARKER, spill=spill.folder)
        reports = []
        for source, report in zip(sources, map_files(task, sources, worker_count(options.jobs, sources)),
                                  strict=True):
            reports.append(report)
            options.progress.read(source)
        return _run(paths, reports, spill, options)


def _run(paths: list[Path], reports: list[ParsedReport], spill: Spill, options: IngestOptions) -> RunData:
    options.progress.phase("assigning ranks and aligning clocks")
    notes = [n for r in reports for n in r.notes]
    units = pl.concat([r.units.with_columns(pl.lit(i, _I64).alias("report")) for i, r in enumerate(reports)])
    ranks = _assign_ranks(units, reports)
    multi_gpu = ranks.filter(pl.col("device").is_not_null()).group_by("report", "pid").agg(pl.col("device").sort())
    for report, pid, devices in multi_gpu.filter(pl.col("device").list.len() > 1).sort("report", "pid").rows():
        notes.append(f"{reports[report].source.name}: process {pid} drives {len(devices)} GPUs (devices "
                     f"{', '.join(map(str, devices))}): one rank per device")
    offsets = _clock_offsets(reports, notes)
    if any(offsets):
        notes.append("clock offsets from session start (utcEpochNs): "
                     + ", ".join(f"{r.source.name} +{o} ns" for r, o in zip(reports, offsets, strict=True)))
    notes += sum((r.sync_counts for r in reports), SyncCounts()).notes()
    if unowned := sum(r.unowned for r in reports):
        notes.append(f"{unowned} NVTX ranges of processes without GPU activity were left out")
    require_overlapping_clocks([(str(r.source), r.span[0] + o, r.span[1] + o)
                                for r, o in zip(reports, offsets, strict=True) if r.span])
    keys = ranks.select("report", "unit", "rank", pl.col("report").replace_strict(
        dict(enumerate(offsets)), return_dtype=_I64).alias("_offset"))

    def ranked(name: str) -> pl.DataFrame:
        frame = pl.concat([getattr(r, name).with_columns(pl.lit(i, _I64).alias("report"))
                           for i, r in enumerate(reports)], how="vertical_relaxed")
        return frame.join(keys, on=["report", "unit"]).with_columns(
            [(pl.col(c) + pl.col("_offset")).alias(c) for c in ("start_ns", "end_ns")]).drop(
            "report", "unit", "_offset")

    collectives, steps = ranked("collectives"), ranked("steps")
    if any(r.has_events for r in reports):
        unit_rank = {(i, u): r for i, u, r in keys.select("report", "unit", "rank").rows()}
        notes += sum((replace(r.links, unlinked=[unit_rank[(i, u)] for u in r.links.unlinked])
                      for i, r in enumerate(reports)), StepLinks()).notes()
    spill.parts = keys.select(pl.concat_str(pl.col("report").replace_strict(
        dict(enumerate(r.key for r in reports)), return_dtype=_STR), pl.lit("-"), pl.col("unit").cast(_STR))
        .alias("key"), "rank", pl.col("_offset").alias("shift")).cast(dict(spill.parts.schema))
    rank_rows = ranks.with_columns(
        pl.col("report").replace_strict({i: r.host for i, r in enumerate(reports)}, return_dtype=_STR).alias("host"),
        pl.col("report").replace_strict(dict(enumerate(offsets)), return_dtype=_I64).alias("clock_offset_ns"),
        pl.col("report").replace_strict({i: str(r.source) for i, r in enumerate(reports)}, return_dtype=_STR)
        .alias("source"),
    ).sort("rank")
    versions = sorted({r.version for r in reports if r.version})
    return RunData(
        source_format="nsys",
        sources=[str(p.resolve()) for p in paths],
        world_size=int(rank_rows["rank"].max()) + 1,  # type: ignore[arg-type]
        tool_version=", ".join(versions) or None,
        rank_source=", ".join(sorted(set(rank_rows["rank_source"].to_list()))),
        notes=notes,
        frames={"ranks": rank_rows, "collectives": collectives.drop("stream", "start_ns", "end_ns"), "steps": steps},
        spill=spill,
        comm_events=collectives.select("rank", "event_id", "stream", "start_ns", "end_ns"),
        dropped=sum((r.dropped for r in reports), Dropped()),
    )
