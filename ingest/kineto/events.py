"""One Kineto file into DuckDB: the JSON parsed straight into the typed table ``ev`` (no Python loop per event), and
its metadata (distributedInfo, baseTimeNanoseconds) checked. The reader (reader.py), CPU-only runs (cpu.py) and
`traceana calibrate` work on ``ev``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import duckdb

from traceana.errors import TraceanaError, first_line
from traceana.ingest.formats import not_read
from traceana.ingest.kineto.split import Unsplit, events_pipe
from traceana.ingest.validate import MAX_RANK, MAX_TIME_NS, checked_rank, rank_list

_SUFFIXES = (".json", ".json.gz")
STEP = r"^ProfilerStep#(\d+)$"  # the profiler's step ranges; the number is the step
# Elements of an op's first input tensor (Input Dims [[65536, 384], ...]): the payload when args lack msg nelems.
FIRST_INPUT_NELEMS = "list_reduce(TRY_CAST(input_dims->0 AS BIGINT[]), lambda x, y: x * y, 1)"

# Only the fields traceana reads; DuckDB ignores the rest. JSON-typed where traces disagree on the type and the
# value is kept as text; VARCHAR where it is only read as a number (TRY_CAST): DuckDB writes any JSON value as text
# there, which casts as the JSON's own text would, without parsing that text again per row.
_FIELDS = {
    "ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "JSON", "tid": "JSON", "ts": "DECIMAL(24,3)",
    "dur": "DECIMAL(24,3)",
    "args": 'STRUCT("External id" VARCHAR, correlation VARCHAR, stream VARCHAR, "Collective name" VARCHAR, '
            '"In msg nelems" VARCHAR, dtype VARCHAR, "Process Group Name" VARCHAR, "Process Group Ranks" JSON, '
            '"Process Group Description" VARCHAR, "Seq" VARCHAR, "Input Dims" JSON, "Input type" JSON, '
            '"Concrete Inputs" JSON, "dst rank" VARCHAR, "src rank" VARCHAR, "Total Allocated" VARCHAR, '
            '"Total Reserved" VARCHAR, "Device Type" VARCHAR, "Group size" VARCHAR, wait_on_stream VARCHAR, '
            'wait_on_cuda_event_record_corr_id VARCHAR, cuda_sync_kind VARCHAR, labels VARCHAR)'}
_EVENT = f"STRUCT({', '.join(f'{name} {kind}' for name, kind in _FIELDS.items())})[]"  # the document's list
_RECORD = "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in _FIELDS.items()) + "}"  # one record's columns

# Kineto's category of every vintage and accelerator, spelled as CUDA traces have since 2022: the 2021 names
# (`Operator`, `Runtime`, `Kernel`, `Memcpy`, `Memset`, `User`), any case; every launch API (HIP's too, `xpu_runtime`,
# `mtia_runtime`, ...) as `cuda_runtime` / `cuda_driver`; the work of other devices and CUPTI modes as `kernel` /
# `gpu_memcpy` (MTIA's `mtia_ccp_events`, whose `dma*` events are copies; the range profiler's one event per kernel).
# A category Kineto never wrote that runs on a device (a stream id, or a process the trace labels a device) is
# device work too (`kernel`, classified by name); the rest keeps its own spelling and is not read.
_RUNTIMES = ("runtime", "cuda_runtime", "xpu_runtime", "mtia_runtime", "privateuse1_runtime", "hpu_op", "glow_runtime")
_DRIVERS = ("cuda_driver", "xpu_driver", "privateuse1_driver")
# Categories Kineto writes that are not kernels or copies (host ranges, syncs, counters, overhead, spans).
NOT_DEVICE_WORK = ("cpu_instant_event", "python_function", "overhead", "trace", "cuda_sync", "cuda_event",
                   "mtia_insight", "mtia_counters", "collective_comm", "xpu_scope_profiler", "xpu_sync",
                   "hardware_counters", "external_correlation")
# The categories read (_CATEGORY's spelling): a file with events but none of these is no PyTorch profiler trace.
KINETO_CATEGORIES = ("cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy", "gpu_memset",
                     "cuda_runtime", "cuda_driver", "cuda_sync")
_CATEGORY = f"""CASE
    WHEN lower(e.cat) IN ('kernel', 'cuda_profiler_range') THEN 'kernel'
    WHEN lower(e.cat) IN ('memcpy', 'gpu_memcpy') THEN 'gpu_memcpy'
    WHEN lower(e.cat) IN ('memset', 'gpu_memset') THEN 'gpu_memset'
    WHEN lower(e.cat) = 'mtia_ccp_events' THEN CASE WHEN starts_with(e.name, 'dma') THEN 'gpu_memcpy' ELSE 'kernel' END
    WHEN lower(e.cat) IN ('operator', 'cpu_op') THEN 'cpu_op'
    WHEN lower(e.cat) = 'user_annotation' THEN 'user_annotation'
    WHEN lower(e.cat) IN ('user', 'gpu_user_annotation') THEN 'gpu_user_annotation'
    WHEN lower(e.cat) IN {_RUNTIMES} THEN 'cuda_runtime'
    WHEN lower(e.cat) IN {_DRIVERS} THEN 'cuda_driver'
    WHEN lower(e.cat) = 'cuda_sync' THEN 'cuda_sync'
    WHEN coalesce(lower(e.cat), '') NOT IN {NOT_DEVICE_WORK} AND e.ph = 'X'
         AND (e.args.stream IS NOT NULL OR e.pid->>'$' IN (SELECT pid FROM devices)) THEN 'kernel'
    ELSE e.cat END"""


# The table load fills (also read by traceana calibrate, which needs the operators' input shapes).
EVENT_TABLE = (
    "CREATE TABLE ev (f INTEGER, ph VARCHAR, cat VARCHAR, name VARCHAR, pid VARCHAR, tid VARCHAR, "
    "start_ns BIGINT, end_ns BIGINT, ext_id BIGINT, corr BIGINT, stream BIGINT, coll_name VARCHAR, "
    "in_nelems BIGINT, dtype VARCHAR, pg_name VARCHAR, pg_ranks VARCHAR, pg_desc VARCHAR, seq BIGINT, "
    "input_dims JSON, input_type JSON, concrete JSON, peer INTEGER, mem_allocated BIGINT, mem_reserved BIGINT, "
    "mem_device_type INTEGER, group_size INTEGER, wait_stream BIGINT, record_corr BIGINT, sync_kind VARCHAR, "
    "kineto_cat VARCHAR)"  # cat: the category in today's spelling (_CATEGORY); kineto_cat: as the file wrote it
)


def trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
    return [path] if path.name.endswith(_SUFFIXES) else []


class Loaded(NamedTuple):
    info: dict  # distributedInfo, checked
    device_names: list[str]  # the devices deviceProperties lists ('NVIDIA H200')
    vintage: str  # which Kineto wrote the file, as far as the file tells (runs.tool_version)
    unphased: int  # events left out: their ph is missing or no phase the Trace Event Format defines


# The Trace Event Format's phases: an event with another ph (or none) is damaged, left out and counted in a note.
PHASES = ("B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c",
          "(", ")")


def load(con: duckdb.DuckDBPyConnection, file: Path, index: int) -> Loaded:
    """Load one file's events into table ``ev`` (tagged with ``f = index``); return its metadata.

    One typed pass over the JSON: the events stream into ``ev`` (:func:`_streamed`), the metadata values read from
    the document around them; where that cannot be, the document is read whole (:func:`_whole`)."""
    if file.stat().st_size == 0:
        raise TraceanaError(f"{file}: the file is empty")
    try:
        meta, events = _streamed(con, file, index), None
        if meta is None:
            meta, events = _whole(con, file)
        if len(meta) != 1 or meta[0][2] is None:
            raise TraceanaError(f"{file}: {not_read(file)}")
        info, base = _metadata(file, meta[0][0], meta[0][1])
        if events is None and base and not _based(con, index, base):
            con.execute("DELETE FROM ev WHERE f = $f", {"f": index})
            meta, events = _whole(con, file)
        if events is not None:
            con.execute(_INSERT.format(index=index, base=base, events=events))
        unphased = con.execute(f"SELECT count(*) FROM ev WHERE f = $f AND (ph IS NULL OR ph NOT IN {PHASES})",
                               {"f": index}).fetchall()[0][0]
        if unphased:
            con.execute(f"DELETE FROM ev WHERE f = $f AND (ph IS NULL OR ph NOT IN {PHASES})", {"f": index})
        written, read = con.execute(f"SELECT list(DISTINCT kineto_cat), count(*) FILTER (WHERE cat IN "
                                    f"{KINETO_CATEGORIES}) FROM ev WHERE f = $f", {"f": index}).fetchall()[0]
        if written and not read:
            raise TraceanaError(f"{file}: {not_read(file)} (categories {', '.join(sorted(map(str, written)))})")
    except (duckdb.Error, UnicodeDecodeError) as exc:  # DuckDB may fail to decode its own message
        raise TraceanaError(f"{file}: not a readable Kineto trace ({first_line(exc)})") from None
    finally:
        con.execute("DROP TABLE IF EXISTS kineto_file")
    return Loaded(info, [n for n in meta[0][3] or [] if n],
                  _vintage(meta[0][4], set(filter(None, written or [])), bool(meta[0][1]), info.get("backend")),
                  unphased)


def _streamed(con: duckdb.DuckDBPyConnection, file: Path, index: int) -> list[tuple] | None:
    """The metadata row of ``file``, its traceEvents array streamed to DuckDB as records (split.py) straight into
    ``ev`` with times from 0 (baseTimeNanoseconds may follow the events: :func:`_based` adds it); None, nothing
    inserted, where that cannot be (no FIFOs, another layout, a malformed array). Into ``ev`` in one statement:
    through a temporary table first, the 109k events of hta_rank3of8_6steps took 0.38 s, now 0.26-0.29 s."""
    if not hasattr(os, "mkfifo"):
        return None
    try:
        with events_pipe(file) as pipe:
            con.execute(_INSERT.format(index=index, base=0, events=(
                f"SELECT k AS e FROM read_json('{_quoted(pipe.path)}', format='array', records=true, "
                f"compression='none', columns={_RECORD}) k")))
            return con.execute(_META_SQL.format(reader=_document(pipe.document()))).fetchall()
    except (duckdb.Error, UnicodeDecodeError, OSError, Unsplit):  # OSError: no temporary folder or FIFO
        con.execute("DELETE FROM ev WHERE f = $f", {"f": index})
        return None


def _based(con: duckdb.DuckDBPyConnection, index: int, base: int) -> bool:
    """Add ``base`` to the times of file ``index``'s rows, which :func:`_streamed` read from 0, as the insert would
    have (in HUGEINT, a sum no BIGINT holds NULL); False, nothing changed, where a time is NULL: it may be one that
    only the base brings into range, so the file is read again with its base."""
    if con.execute("SELECT count(*) FROM ev WHERE f = $f AND (start_ns IS NULL OR end_ns IS NULL)",
                   {"f": index}).fetchall()[0][0]:
        return False
    con.execute("UPDATE ev SET start_ns = TRY_CAST(start_ns::HUGEINT + $base AS BIGINT), "
                "end_ns = TRY_CAST(end_ns::HUGEINT + $base AS BIGINT) WHERE f = $f", {"f": index, "base": base})
    return True


def _whole(con: duckdb.DuckDBPyConnection, file: Path) -> tuple[list[tuple], str]:
    """(the metadata row, the query of the events as rows ``e``) of ``file`` read as one document into table
    kineto_file, one row (a second read_json for the metadata alone cost as much as the events)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE kineto_file AS SELECT * FROM {_document(file)}")
    return con.execute(_META_SQL.format(reader="kineto_file")).fetchall(), \
        "SELECT unnest(traceEvents) AS e FROM kineto_file"


_META_SQL = ("SELECT distributedInfo, baseTimeNanoseconds, len(traceEvents), "
             "json_extract_string(deviceProperties, '$[*].name'), schemaVersion FROM {reader}")


def _document(path: Path) -> str:
    """read_json of a whole Kineto document: its events one list, the metadata the reader checks as JSON."""
    return (f"read_json('{_quoted(path)}', format='unstructured', maximum_object_size=4000000000, "
            f"columns={{'traceEvents': '{_EVENT}', 'distributedInfo': 'JSON', 'baseTimeNanoseconds': 'JSON', "
            "'deviceProperties': 'JSON', 'schemaVersion': 'JSON'})")


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _vintage(schema: str | None, categories: set[str], based: bool, backend: str | None) -> str:
    """The Kineto generation a file's own spelling dates (research: formats-vintages-rocprof.md, 1.4): categories
    were renamed Operator -> cpu_op (2021-06), Runtime -> cuda_runtime (2021-11), Kernel/Memcpy/Memset -> kernel/
    gpu_memcpy/gpu_memset (2022-04); times count from baseTimeNanoseconds since 2024-05."""
    if "Operator" in categories:
        era = "2021 categories (Operator, Runtime, Kernel)"
    elif "Runtime" in categories:
        era = "2021 categories (cpu_op, Runtime, Kernel)"
    elif categories & {"Kernel", "Memcpy", "Memset"}:
        era = "2021-22 categories (cuda_runtime, Kernel)"
    else:
        era = "2022+ categories"
    devices = [name for cat, name in (("mtia_ccp_events", "MTIA"), ("cuda_profiler_range", "CUPTI range profiler"),
                                      ("xpu_runtime", "XPU"), ("hpu_op", "HPU")) if cat in categories]
    parts = [f"kineto schema {schema or '?'}", era, *devices,
             "times from baseTimeNanoseconds" if based else "epoch times", backend]
    return ", ".join(p for p in parts if p)


_INSERT = """INSERT INTO ev
        WITH raw AS ({events}),
        devices AS (SELECT DISTINCT e.pid->>'$' AS pid FROM raw  -- the processes the trace labels "GPU 0", "MTIA 9"
                    WHERE e.ph = 'M' AND e.name = 'process_labels' AND e.args.labels <> 'CPU')
        SELECT {index} AS f, e.ph, """ + _CATEGORY + """ AS cat, e.name, e.pid->>'$' AS pid, e.tid->>'$' AS tid,
            TRY_CAST({base}::HUGEINT + e.ts * 1000 AS BIGINT) AS start_ns,
            TRY_CAST({base}::HUGEINT + e.ts * 1000 + coalesce(e.dur, 0) * 1000 AS BIGINT) AS end_ns,
            TRY_CAST(e.args."External id" AS BIGINT) AS ext_id,
            TRY_CAST(e.args.correlation AS BIGINT) AS corr,
            TRY_CAST(e.args.stream AS BIGINT) AS stream,
            e.args."Collective name" AS coll_name,
            TRY_CAST(e.args."In msg nelems" AS BIGINT) AS in_nelems,
            e.args.dtype AS dtype,
            e.args."Process Group Name" AS pg_name,
            e.args."Process Group Ranks"->>'$' AS pg_ranks,
            e.args."Process Group Description" AS pg_desc,
            TRY_CAST(e.args."Seq" AS BIGINT) AS seq,
            e.args."Input Dims" AS input_dims, e.args."Input type" AS input_type,
            e.args."Concrete Inputs" AS concrete,
            TRY_CAST(coalesce(e.args."dst rank", e.args."src rank") AS INTEGER) AS peer,
            TRY_CAST(e.args."Total Allocated" AS BIGINT) AS mem_allocated,
            TRY_CAST(e.args."Total Reserved" AS BIGINT) AS mem_reserved,
            TRY_CAST(e.args."Device Type" AS INTEGER) AS mem_device_type,
            TRY_CAST(e.args."Group size" AS INTEGER) AS group_size,
            TRY_CAST(e.args.wait_on_stream AS BIGINT) AS wait_stream,
            TRY_CAST(e.args.wait_on_cuda_event_record_corr_id AS BIGINT) AS record_corr,
            e.args.cuda_sync_kind AS sync_kind, e.cat AS kineto_cat
        FROM raw WHERE e.ph = 'X' OR e.name = '[memory]' OR e.ph IS NULL OR e.ph NOT IN """ + str(PHASES)


def _metadata(file: Path, distributed: str | None, base: str | None) -> tuple[dict, int]:
    """distributedInfo (rank, world_size and pg_config checked and normalized) and baseTimeNanoseconds; a field
    of the wrong type is a one-line error naming it."""
    info = json.loads(distributed) if distributed else {}
    if not isinstance(info, dict):
        raise TraceanaError(f"{file}: distributedInfo is {json.dumps(info)[:60]}, not an object")
    info["rank"] = checked_rank(info.get("rank"), str(file), "distributedInfo.rank")
    size = info.get("world_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_RANK):
        raise TraceanaError(f"{file}: distributedInfo.world_size is {size!r}, not a number of ranks")
    groups = info.get("pg_config")
    if groups is not None and not (isinstance(groups, list) and all(isinstance(g, dict) for g in groups)):
        raise TraceanaError(f"{file}: distributedInfo.pg_config is {json.dumps(groups)[:60]}, not a list of objects")
    for group in groups or []:
        group["ranks"] = rank_list(group.get("ranks"), file, "distributedInfo.pg_config ranks")
    value = json.loads(base) if base else 0
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIME_NS:
        raise TraceanaError(f"{file}: baseTimeNanoseconds is {value!r}, not a time in ns")
    return info, value

