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

Kernels, memcpys and memsets become device_events (kernel names through StringIds: the short name is classified,
the demangled name kept); NVTX push/pop and start/end ranges become annotations, with the name
``COALESCE(text, StringIds[textId])`` and the domain from the process's domain-create rows. An export with no
kernel table is ingested with a note (no device activity); one with neither GPU activity nor NVTX ranges is
refused. CUDA synchronization records are host-side waits, not device work, and are not read.

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

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.clocks import require_overlapping_clocks
from traceana.ingest.executor import map_files, worker_count
from traceana.ingest.nsys.comm import collective_ops
from traceana.ingest.nsys.export import Export, export_report, is_sqlite
from traceana.ingest.ranks import rank_in_file_name, require_unique_ranks
from traceana.ingest.rules import Rule, with_classes
from traceana.ingest.run_data import RunData
from traceana.ingest.spill import Spill, new_spill, spill_file
from traceana.ingest.step_windows import StepLinks, marker_steps, step_windows_of
from traceana.ingest.validate import Dropped, checked_rank

if TYPE_CHECKING:
    from traceana.ingest.dispatch import IngestOptions

# ProfilerStep#N and common iteration / step range names ("train_step 3", "iteration 12", "step_4").
DEFAULT_STEP_MARKER = r"(?i)^(ProfilerStep#\d+|(train(ing)?[ _-]?)?(step|iteration|iter)[ _#-]*\d+)$"
ENV_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange and their NVTXT forms
NVTX_DOMAIN_CREATE = 75
# CUPTI's memcpy kinds (CUpti_ActivityMemcpyKind; 2.x exports have no ENUM table for them).
MEMCPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
                8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "Unified HtoD", 12: "Unified DtoH", 13: "Unified DtoD"}
_PYTORCH_SUFFIX = r"(?s), (?:seq|op_id|sizes) = .*$"  # emit_nvtx appends these to op names
_I64 = pl.Int64()
_STR = pl.String()
_DEVICE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
_DEVICE_COLUMNS = {"start": _I64, "end": _I64, "deviceId": _I64, "streamId": _I64, "correlationId": _I64,
                   "globalPid": _I64}


def matches(path: Path) -> bool:
    """A .nsys-rep, an SQLite export, or a folder holding either."""
    if path.is_dir():
        return any(_is_report(p) for p in path.iterdir())
    if path.suffix in (".nsys-rep", ".sqlite", ".sqlite3"):
        return True
    return is_sqlite(path) and _has_nsys_tables(path)


def _is_report(path: Path) -> bool:
    return path.is_file() and (path.suffix == ".nsys-rep" or (path.suffix == ".sqlite" and is_sqlite(path)))


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
    """Every report file the paths name, once, in natural order (rank_10 after rank_2)."""
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
    unique = {p.resolve(): p for p in files}
    return sorted(unique.values(), key=_natural)


@dataclass
class Report:
    """One export, parsed (what :func:`parse_report` numbers, windows, validates and spills)."""

    source: Path
    units: pl.DataFrame          # pid, device, stated_rank, stated_source: the ranks this report holds
    device: pl.DataFrame         # pid, device, stream, start_ns, end_ns, name, category, op, kernel_op, ...
    ranges: pl.DataFrame         # pid, start_ns, end_ns, name, domain, args
    host: str | None
    session_start: int | None
    version: str | None
    notes: list[str]


def _pid(gid: str) -> pl.Expr:
    """globalPid / globalTid layout: hw:8 vm:8 pid:24 tid:24."""
    return (pl.col(gid) // 16777216) & 16777215


def _device_activity(export: Export, strings: pl.DataFrame) -> pl.DataFrame | None:
    """Kernels, memcpys and memsets as pid, device, stream, start_ns, end_ns, name, short, correlationId."""
    parts = []
    names = strings.rename({"id": "_sid", "value": "_sval"})
    required = ("start", "end", "deviceId")
    kernels = export.frame("CUPTI_ACTIVITY_KIND_KERNEL",
                           {**_DEVICE_COLUMNS, "shortName": _I64, "demangledName": _I64},
                           required=(*required, "shortName"))
    if kernels is not None:
        kernels = (
            kernels.join(names.rename({"_sid": "shortName", "_sval": "short"}), on="shortName", how="left")
            .join(names.rename({"_sid": "demangledName", "_sval": "_full"}), on="demangledName", how="left")
            .with_columns(pl.coalesce("_full", "short", pl.lit("kernel")).alias("name"))
        )
        if nameless := kernels.filter(pl.col("short").is_null()).height:
            export.notes.append(f"{export.path.name}: {nameless} kernels name no string in StringIds (a missing or "
                                f"cut-down string table); they are named 'kernel' and classified as compute")
        parts.append(kernels)
    memcpy = export.frame("CUPTI_ACTIVITY_KIND_MEMCPY", {**_DEVICE_COLUMNS, "copyKind": _I64}, required=required)
    if memcpy is not None:
        kind = pl.col("copyKind").replace_strict(MEMCPY_KINDS, default="Unknown", return_dtype=_STR)
        parts.append(memcpy.with_columns(pl.concat_str(pl.lit("Memcpy "), kind).alias("name")))
    memset = export.frame("CUPTI_ACTIVITY_KIND_MEMSET", _DEVICE_COLUMNS, required=required)
    if memset is not None:
        parts.append(memset.with_columns(pl.lit("Memset").alias("name")))
    if not parts:
        return None
    frame = pl.concat([p.select(*_DEVICE_COLUMNS, "name", pl.col("short") if "short" in p.columns
                                else pl.lit(None, _STR).alias("short")) for p in parts])
    frame = frame.select(
        _pid("globalPid").alias("pid"), pl.col("deviceId").alias("device"), pl.col("streamId").alias("stream"),
        pl.col("start").alias("start_ns"), pl.col("end").alias("end_ns"), "name",
        pl.coalesce("short", "name").alias("short"), "correlationId",
    )
    frame = _attributed(frame, export.notes, export.path.name)
    return frame.with_row_index("key").with_columns(pl.col("key").cast(_I64))


def _attributed(frame: pl.DataFrame, notes: list[str], source: str) -> pl.DataFrame:
    """Rows whose process or device id is unknown (NULL, or the "none" sentinel) must not become a rank of their
    own: an unknown process is the device's only process; a row without a device, where others have one, is left
    out with a note."""
    known = pl.col("pid").drop_nulls()
    frame = frame.with_columns(pl.when(pl.col("pid").is_null() & (known.n_unique().over("device") == 1))
                               .then(known.first().over("device")).otherwise(pl.col("pid")).alias("pid"))
    lost = pl.col("device").is_null() & pl.col("device").is_not_null().any()
    if dropped := frame.filter(lost).height:
        notes.append(f"{source}: {dropped} GPU activity rows without a device id left out")
    return frame.filter(~lost)


def _nvtx_ranges(export: Export, strings: pl.DataFrame) -> pl.DataFrame | None:
    """NVTX ranges as pid, tid, start_ns, end_ns, name, domain, args (PyTorch's op_id / seq moved to args)."""
    nvtx = export.frame("NVTX_EVENTS", {"start": _I64, "end": _I64, "eventType": _I64, "text": _STR,
                                        "textId": _I64, "domainId": _I64, "globalTid": _I64},
                        required=("start", "eventType"))
    if nvtx is None:
        return None
    nvtx = nvtx.with_columns(_pid("globalTid").alias("pid"), (pl.col("globalTid") & 16777215).alias("tid"))
    domains = nvtx.filter(pl.col("eventType") == NVTX_DOMAIN_CREATE).group_by("pid", "domainId").agg(
        pl.col("text").first().alias("_domain")
    )
    ranges = nvtx.filter(pl.col("eventType").is_in(NVTX_RANGE_TYPES) & pl.col("end").is_not_null())
    ranges = ranges.join(strings.rename({"id": "textId", "value": "_registered"}), on="textId", how="left")
    ranges = ranges.join(domains, on=["pid", "domainId"], how="left")
    text = pl.coalesce("text", "_registered", pl.lit(""))
    ids = pl.struct(text.str.extract(r"op_id = (\d+)").cast(_I64).alias("op_id"),
                    text.str.extract(r"seq = (\d+)").cast(_I64).alias("seq"))
    return ranges.select(
        "pid", "tid", pl.col("start").alias("start_ns"), pl.col("end").alias("end_ns"),
        text.str.replace(_PYTORCH_SUFFIX, "").alias("name"),
        pl.when(pl.col("domainId").fill_null(0) == 0).then(None)
        .otherwise(pl.coalesce("_domain", pl.format("domain {}", "domainId"))).alias("domain"),
        pl.when(text.str.contains(_PYTORCH_SUFFIX)).then(ids.struct.json_encode()).alias("args"),
    )


def _launches(export: Export, launched: pl.Series) -> pl.DataFrame | None:
    """The runtime calls that launched device work: only those whose correlationId a kernel, copy or memset has
    (``launched``; the rest, synchronizations, allocations, event records, are never joined: 64% of the runtime
    rows of the shared H100 export)."""
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in export.tables:
        return None
    tables = [f'SELECT correlationId FROM "{t}"' for t in _DEVICE_TABLES
              if t in export.tables and "correlationId" in export.columns(t)]
    narrow = (f"WHERE correlationId IN ({' UNION ALL '.join(tables)})"
              if tables and "correlationId" in export.columns("CUPTI_ACTIVITY_KIND_RUNTIME") else "")
    runtime = export.frame("CUPTI_ACTIVITY_KIND_RUNTIME", {"start": _I64, "globalTid": _I64, "correlationId": _I64},
                           narrow=narrow)
    if runtime is None:
        return None
    return runtime.filter(pl.col("correlationId").is_in(launched.implode())).select(
        _pid("globalTid").alias("pid"), (pl.col("globalTid") & 16777215).alias("tid"), "correlationId",
        pl.col("start").alias("launch_ns"))


def _stated_ranks(export: Export, strings: pl.DataFrame, pids: list[int | None]) -> dict[int | None, tuple[int, str]]:
    """pid -> (rank, source) where the report says it: MPI_RANKS, "MPI Rank N" thread names, captured env."""
    stated: dict[int | None, tuple[int | None, str]] = {}
    threads = export.frame("ThreadNames", {"nameId": _I64, "globalTid": _I64})
    if threads is not None:
        named = threads.join(strings.rename({"id": "nameId"}), on="nameId").select(
            _pid("globalTid").alias("pid"), pl.col("value").str.extract(r"^MPI Rank (\d+)$").cast(_I64).alias("rank")
        ).drop_nulls()
        stated |= {pid: (checked_rank(rank, str(export.path), "thread name 'MPI Rank N'"), "thread-name")
                   for pid, rank in named.unique("pid").iter_rows()}
    mpi = export.frame("MPI_RANKS", {"globalTid": _I64, "rank": _I64})
    if mpi is not None:
        stated |= {pid: (checked_rank(rank, str(export.path), "MPI_RANKS.rank"), "MPI_RANKS") for pid, rank in
                   mpi.select(_pid("globalTid").alias("pid"), "rank").drop_nulls().unique("pid").iter_rows()}
    if len(pids) == 1 and pids[0] not in stated:  # the captured environment is the launched process's
        env = export.capture_env()
        var = next((v for v in ENV_RANK_VARS if env.get(v, "").isdigit()), None)
        if var is not None:
            stated[pids[0]] = (checked_rank(int(env[var]), str(export.path), f"captured environment {var}"),
                               f"env:{var}")
    return {pid: (rank, source) for pid, (rank, source) in stated.items() if rank is not None}


def _read_report(source: Path, cache_dir: Path, rules: list[Rule]) -> Report:
    """One report's tables as its export holds them, before units are numbered."""
    path = export_report(source, cache_dir) if source.suffix == ".nsys-rep" else source
    export = Export(path)
    try:
        strings = export.strings()
        device = _device_activity(export, strings)
        ranges = _nvtx_ranges(export, strings)
        absent = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS") if t not in export.tables]
        if absent:
            export.notes.append(f"{source.name}: no {' or '.join(absent)} table (lazy exports omit empty tables)")
        if device is None or device.is_empty():
            if ranges is None or ranges.is_empty():
                raise TraceanaError(f"{source}: nothing to ingest (no kernels, memory copies or NVTX ranges)")
            export.notes.append(f"{source.name}: no GPU activity; ranks are the processes with NVTX ranges")
            units = ranges.select("pid", pl.lit(None, _I64).alias("device")).unique()
            device = None
        else:
            units = device.select("pid", "device").unique()
            device = _with_collectives(device, export, ranges, rules)
        stated = _stated_ranks(export, strings, units["pid"].unique().to_list())
        units = units.with_columns(
            pl.col("pid").replace_strict({p: r for p, (r, _) in stated.items()}, default=None, return_dtype=_I64)
            .alias("stated_rank"),
            pl.col("pid").replace_strict({p: s for p, (_, s) in stated.items()}, default=None, return_dtype=_STR)
            .alias("stated_source"),
        ).sort("device", "pid", nulls_last=True)
        host = export.scalar("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1")
        start = export.scalar("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
        if path != source:
            export.notes.append(f"{source.name}: exported with nsys to {path}")
        return Report(source, units, device if device is not None else _no_device(),
                      ranges if ranges is not None else pl.DataFrame(schema=_RANGE_SCHEMA),
                      str(host) if host is not None else None, int(start) if start is not None else None,
                      export.version, export.notes)
    finally:
        export.close()


_RANGE_SCHEMA = {"pid": _I64, "tid": _I64, "start_ns": _I64, "end_ns": _I64, "name": _STR, "domain": _STR,
                 "args": _STR}
_DEVICE_SCHEMA = {"pid": _I64, "device": _I64, "stream": _I64, "start_ns": _I64, "end_ns": _I64, "name": _STR,
                  "category": _STR, "op": _STR, "kernel_op": _STR, "dtype": _STR, "evidence": _STR,
                  "launch_ns": _I64}


def _no_device() -> pl.DataFrame:
    return pl.DataFrame(schema=_DEVICE_SCHEMA)


def _with_collectives(device: pl.DataFrame, export: Export, ranges: pl.DataFrame | None,
                      rules: list[Rule]) -> pl.DataFrame:
    """Classify every device event; add op, kernel_op, dtype and evidence to the communication ones, and the time
    of the runtime call that launched each event (launch_ns, by pid and correlationId)."""
    device = with_classes(device, "short", rules)
    launches = _launches(export, device["correlationId"])
    if launches is not None:
        first = launches.group_by("pid", "correlationId").agg(pl.col("launch_ns").min())  # 2022.x: some twice
        device = device.join(first, on=["pid", "correlationId"], how="left")
    comm = device.filter(pl.col("category") == "comm").select("key", "pid", "correlationId", "short", "rule_op")
    needs_launches = comm["short"].str.contains(r"^nccl(?:Dev)?Kernel_(?:SendRecv|Generic)").any()
    ops = collective_ops(comm, launches if needs_launches else None, ranges)
    return device.join(ops, on="key", how="left").select(
        *(pl.col(c) if c in device.columns or c in ops.columns else pl.lit(None, t).alias(c)
          for c, t in _DEVICE_SCHEMA.items()))


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
    host: str | None
    session_start: int | None
    version: str | None
    notes: list[str]


def parse_report(source: Path, *, cache_dir: Path, rules: list[Rule], marker: str, spill: Path) -> ParsedReport:
    """Everything about one report that needs no other report (in a worker process with --jobs): parse, event ids,
    the units' step windows, validation; device events and NVTX ranges are written to ``spill``."""
    report = _read_report(source, cache_dir, rules)
    units = report.units.with_row_index("unit").with_columns(pl.col("unit").cast(_I64))
    keys = units.select("pid", "device", pl.col("unit").alias("rank"))
    device = report.device.join(keys, on=["pid", "device"], nulls_equal=True)
    device = device.sort("rank", "start_ns", "end_ns", "stream").with_columns(
        pl.int_range(pl.len()).over("rank").cast(_I64).alias("event_id"))
    owners = keys.select("pid", "rank")
    annotations = report.ranges.join(owners, on="pid", nulls_equal=True)  # a multi-GPU process: every rank
    unowned = report.ranges.join(owners, on="pid", how="anti", nulls_equal=True).height
    annotations = annotations.with_columns(pl.lit("nvtx").alias("kind")).sort("rank", "start_ns")
    span = pl.concat([f.select("start_ns", "end_ns") for f in (device, annotations)]).select(
        pl.col("start_ns").min(), pl.col("end_ns").max()).row(0)
    steps, links = step_windows_of(device, marker_steps(annotations, marker))
    frames, key, dropped = spill_file(spill, "nsys", str(source), {
        "device_events": device, "annotations": annotations, "steps": steps}, per_rank=True)
    device = frames["device_events"]
    return ParsedReport(
        source, key, units, device.filter(pl.col("op").is_not_null()).select(
            pl.col("rank").alias("unit"), "event_id", "op", "kernel_op", "dtype", "evidence", "stream", "start_ns",
            "end_ns"),
        frames["steps"].rename({"rank": "unit"}), links, not device.is_empty(),
        span if span[0] is not None else None, unowned, dropped, report.host, report.session_start, report.version,
        report.notes)


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
