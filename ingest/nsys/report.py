"""One Nsight Systems report's tables as frames: its kernels, memcpys and memsets (names through StringIds,
classified, communication kernels given their op and evidence, each with the time of the runtime call that launched
it), its NVTX ranges, and the ranks its processes state (MPI_RANKS, "MPI Rank N" threads, the captured environment).
reader.py numbers, windows and spills what :func:`read_report` returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.nsys.comm import collective_ops
from traceana.ingest.nsys.export import RUNTIME_COLUMNS, Export, export_report, pid_of
from traceana.ingest.nsys.syncs import RAW_SCHEMA, read_syncs
from traceana.ingest.rules import Rule, with_classes
from traceana.ingest.validate import MAX_TIME_NS, checked_rank

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
_NVTX_COLUMNS = {"start": _I64, "end": _I64, "eventType": _I64, "text": _STR, "textId": _I64, "domainId": _I64,
                 "globalTid": _I64}
_DEVICE_COLUMNS = {"start": _I64, "end": _I64, "deviceId": _I64, "streamId": _I64, "correlationId": _I64,
                   "globalPid": _I64}


@dataclass
class Report:
    """One export, parsed (what :func:`parse_report` numbers, windows, validates and spills)."""

    source: Path
    units: pl.DataFrame          # pid, device, stated_rank, stated_source: the ranks this report holds
    device: pl.DataFrame         # pid, device, stream, start_ns, end_ns, name, category, op, kernel_op, ...
    ranges: pl.DataFrame         # pid, start_ns, end_ns, name, domain, args
    syncs: pl.DataFrame          # sync records and blocking copies, unresolved (syncs.RAW_SCHEMA)
    host: str | None
    session_start: int | None
    version: str | None
    notes: list[str]


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
        pid_of("globalPid").alias("pid"), pl.col("deviceId").alias("device"), pl.col("streamId").alias("stream"),
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
    nvtx = export.frame("NVTX_EVENTS", _NVTX_COLUMNS, required=("start", "eventType"))
    if nvtx is None:
        return None
    nvtx = nvtx.with_columns(pid_of("globalTid").alias("pid"), (pl.col("globalTid") & 16777215).alias("tid"))
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


def _launches(runtime: pl.DataFrame | None, launched: pl.Series) -> pl.DataFrame | None:
    """The runtime calls that launched device work (pid, tid, correlationId, launch_ns): only those whose
    correlationId a kernel, copy or memset has (``launched``; the rest, synchronizations, allocations, event
    records, are never joined: 64% of the runtime rows of the shared H100 export)."""
    if runtime is None:
        return None
    return runtime.filter(pl.col("correlationId").is_in(launched.implode())).select(
        "pid", "tid", "correlationId", pl.col("start").alias("launch_ns"))


def _session_start(value: object, path: Path) -> int | None:
    """TARGET_INFO_SESSION_START_TIME.utcEpochNs as ns, or a one-line error for a value no clock gives."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TIME_NS:
        return value
    raise TraceanaError(f"{path}: TARGET_INFO_SESSION_START_TIME.utcEpochNs is {str(value)[:40]!r}, not a time in "
                        "ns since 1970")


def _stated_ranks(export: Export, strings: pl.DataFrame, pids: list[int | None]) -> dict[int | None, tuple[int, str]]:
    """pid -> (rank, source) where the report says it: MPI_RANKS, "MPI Rank N" thread names, captured env."""
    stated: dict[int | None, tuple[int | None, str]] = {}
    threads = export.frame("ThreadNames", {"nameId": _I64, "globalTid": _I64})
    if threads is not None:
        named = threads.join(strings.rename({"id": "nameId"}), on="nameId").select(
            pid_of("globalTid").alias("pid"), pl.col("value").str.extract(r"^MPI Rank (\d+)$").alias("rank")
        ).drop_nulls()  # the digits as text: a number past int64 is checked_rank's one line, not a failed cast
        stated |= {pid: (checked_rank(int(rank), str(export.path), "thread name 'MPI Rank N'"), "thread-name")
                   for pid, rank in named.unique("pid").iter_rows()}
    mpi = export.frame("MPI_RANKS", {"globalTid": _I64, "rank": _I64})
    if mpi is not None:
        stated |= {pid: (checked_rank(rank, str(export.path), "MPI_RANKS.rank"), "MPI_RANKS") for pid, rank in
                   mpi.select(pid_of("globalTid").alias("pid"), "rank").drop_nulls().unique("pid").iter_rows()}
    if len(pids) == 1 and pids[0] not in stated:  # the captured environment is the launched process's
        env = export.capture_env()
        var = next((v for v in ENV_RANK_VARS if env.get(v, "").isdigit()), None)
        if var is not None:
            stated[pids[0]] = (checked_rank(int(env[var]), str(export.path), f"captured environment {var}"),
                               f"env:{var}")
    return {pid: (rank, source) for pid, (rank, source) in stated.items() if rank is not None}


def read_report(source: Path, cache_dir: Path, rules: list[Rule]) -> Report:
    """One report's tables as its export holds them, before units are numbered."""
    path = export_report(source, cache_dir) if source.suffix == ".nsys-rep" else source
    export = Export(path)
    try:
        # Read while this thread reads the kernels: the NVTX ranges, and the runtime calls where there is GPU work.
        export.prefetch_table("NVTX_EVENTS", _NVTX_COLUMNS)
        if any(t in export.tables for t in _DEVICE_TABLES):
            export.prefetch_table("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLUMNS)
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
            device = runtime = None
        else:
            units = device.select("pid", "device").unique()
            runtime = export.runtime()
            device = _with_collectives(device, runtime, ranges, rules)
        syncs, odd = (read_syncs(export, strings, runtime) if device is not None
                      else (pl.DataFrame(schema=RAW_SCHEMA), None))
        export.notes += [odd] if odd else []
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
                      ranges if ranges is not None else pl.DataFrame(schema=_RANGE_SCHEMA), syncs,
                      str(host) if host is not None else None, _session_start(start, export.path),
                      export.version, export.notes)
    finally:
        export.close()


_RANGE_SCHEMA = {"pid": _I64, "tid": _I64, "start_ns": _I64, "end_ns": _I64, "name": _STR, "domain": _STR,
                 "args": _STR}
_DEVICE_SCHEMA = {"pid": _I64, "device": _I64, "stream": _I64, "start_ns": _I64, "end_ns": _I64, "name": _STR,
                  "category": _STR, "op": _STR, "kernel_op": _STR, "dtype": _STR, "evidence": _STR,
                  "launch_ns": _I64, "launch_thread": _I64, "correlationId": _I64}


def _no_device() -> pl.DataFrame:
    return pl.DataFrame(schema=_DEVICE_SCHEMA)


def _with_collectives(device: pl.DataFrame, runtime: pl.DataFrame | None, ranges: pl.DataFrame | None,
                      rules: list[Rule]) -> pl.DataFrame:
    """Classify every device event; add op, kernel_op, dtype and evidence to the communication ones, and the time
    of the runtime call that launched each event and its thread (launch_ns, launch_thread, by pid and correlationId:
    the earliest, where a 2022.x export writes a call twice; where every correlationId is once, no grouping is
    needed)."""
    device = with_classes(device, "short", rules)
    launches = _launches(runtime, device["correlationId"])
    if launches is not None:
        first = launches.select("pid", "correlationId", "launch_ns", pl.col("tid").alias("launch_thread"))
        if first["correlationId"].n_unique() < first.height:
            first = first.sort("launch_ns").group_by("pid", "correlationId").first()
        device = device.join(first, on=["pid", "correlationId"], how="left")
    comm = device.filter(pl.col("category") == "comm").select("key", "pid", "correlationId", "short", "rule_op")
    needs_launches = comm["short"].str.contains(r"^nccl(?:Dev)?Kernel_(?:SendRecv|Generic)").any()
    ops = collective_ops(comm, launches if needs_launches else None, ranges)
    return device.join(ops, on="key", how="left").select(
        *(pl.col(c) if c in device.columns or c in ops.columns else pl.lit(None, t).alias(c)
          for c, t in _DEVICE_SCHEMA.items()))
