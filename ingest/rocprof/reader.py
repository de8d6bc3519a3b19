"""rocprofv3 (ROCprofiler-SDK) JSON: ``rocprofv3 --kernel-trace --memory-copy-trace --rccl-trace
--hip-runtime-trace --output-format json``, one ``<pid>_results.json`` per process (research:
formats-vintages-rocprof.md, section 3).

Each element of ``rocprofiler-sdk-tool`` is one process, and one process is one rank (the rank is not recorded: the
file name's rank if it states one, else file order, then process order). Kernels come from
``buffer_records.kernel_dispatch`` (names through ``kernel_symbols``), copies from ``memory_copy``; ``kind`` and
``operation`` are decoded through the file's own ``strings.buffer_records`` table, as their numbers are not stable
across releases. Times are ns of CLOCK_BOOTTIME, shared by the processes of one node. A communication kernel's op is
its name's (NCCL/RCCL names), else that of the RCCL API call (``rccl_api``: ncclAllReduce, ...) open on the thread
that launched it (the HIP API call of the same correlation id). DuckDB parses the JSON; no Python loop per event.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import duckdb
import polars as pl

from traceana.errors import TraceanaError, first_line
from traceana.ingest.comm_names import canonical_op, parse_nccl_kernel
from traceana.ingest.dispatch import IngestOptions
from traceana.ingest.ranks import rank_in_file_name, require_distinct
from traceana.ingest.rules import with_classes
from traceana.ingest.run_data import RunData

_SUFFIXES = (".json", ".json.gz")
_KEY = b'"rocprofiler-sdk-tool"'

_ID = "STRUCT(handle UBIGINT)"
_API = ("STRUCT(kind INTEGER, operation INTEGER, thread_id BIGINT, correlation_id STRUCT(internal BIGINT), "
        "start_timestamp BIGINT, end_timestamp BIGINT)[]")
# Only the fields read; DuckDB skips the rest (counters, code objects, host functions, summaries).
_PROCESS = (
    f"STRUCT(metadata STRUCT(pid BIGINT, node STRUCT(hostname VARCHAR)), "
    f"agents STRUCT(id {_ID}, type INTEGER, gpu_index INTEGER, product_name VARCHAR)[], "
    "kernel_symbols STRUCT(kernel_id BIGINT, formatted_kernel_name VARCHAR, kernel_name VARCHAR)[], "
    "strings STRUCT(buffer_records STRUCT(kind VARCHAR, operations VARCHAR[])[]), "
    "buffer_records STRUCT("
    f"kernel_dispatch STRUCT(kind INTEGER, operation INTEGER, thread_id BIGINT, correlation_id STRUCT(internal "
    f"BIGINT), start_timestamp BIGINT, end_timestamp BIGINT, dispatch_info STRUCT(agent_id {_ID}, queue_id {_ID}, "
    f"kernel_id BIGINT), stream_id {_ID})[], "
    f"memory_copy STRUCT(kind INTEGER, operation INTEGER, thread_id BIGINT, correlation_id STRUCT(internal BIGINT), "
    f"start_timestamp BIGINT, end_timestamp BIGINT, dst_agent_id {_ID}, src_agent_id {_ID}, stream_id {_ID})[], "
    f"hip_api {_API}, rccl_api {_API}))[]"
)

# One row per device event of every process (p): kernels named through kernel_symbols, copies by their decoded
# operation (MEMORY_COPY_HOST_TO_DEVICE), each with the correlation id and thread of the API call that queued it.
_EVENTS_SQL = """
WITH k AS (SELECT p, unnest(proc.buffer_records.kernel_dispatch) AS d FROM procs),
sym AS (SELECT p, unnest(proc.kernel_symbols) AS s FROM procs),
c AS (SELECT p, unnest(proc.buffer_records.memory_copy) AS m, proc.strings.buffer_records AS kinds FROM procs)
SELECT k.p, coalesce(d.stream_id.handle, d.dispatch_info.queue_id.handle) AS stream, d.start_timestamp AS start_ns,
       d.end_timestamp AS end_ns, coalesce(s.s.formatted_kernel_name, s.s.kernel_name,
                                           'kernel ' || d.dispatch_info.kernel_id) AS name,
       false AS copy, d.correlation_id.internal AS corr, d.dispatch_info.agent_id.handle AS agent
FROM k LEFT JOIN sym s ON s.p = k.p AND s.s.kernel_id = d.dispatch_info.kernel_id
UNION ALL
SELECT p, coalesce(m.stream_id.handle, 0), m.start_timestamp, m.end_timestamp,
       coalesce(kinds[m.kind + 1].operations[m.operation + 1], 'MEMORY_COPY'), true, m.correlation_id.internal,
       m.dst_agent_id.handle
FROM c"""

# The API calls of every process, decoded: HIP calls (the launches: corr, thread, time) and RCCL calls (the ranges
# that say which collective a launch inside them belongs to).
_API_SQL = """
WITH a AS (SELECT p, 'hip' AS api, unnest(proc.buffer_records.hip_api) AS r, proc.strings.buffer_records AS kinds
           FROM procs
           UNION ALL
           SELECT p, 'rccl', unnest(proc.buffer_records.rccl_api), proc.strings.buffer_records FROM procs)
SELECT p, api, r.correlation_id.internal AS corr, r.thread_id AS tid, r.start_timestamp AS start_ns,
       r.end_timestamp AS end_ns, kinds[r.kind + 1].operations[r.operation + 1] AS name FROM a"""


def matches(path: Path) -> bool:
    """A rocprofv3 JSON, or a folder of them: ``"rocprofiler-sdk-tool"`` opens the document."""
    return any(_is_rocprof(f) for f in _files(path))


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES))
    return [path] if path.name.endswith(_SUFFIXES) else []


def _is_rocprof(file: Path) -> bool:
    try:
        opener = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rb") as handle:
            return _KEY in handle.read(256)
    except (OSError, EOFError):
        return False


def _load(con: duckdb.DuckDBPyConnection, file: Path, first: int) -> list[dict]:
    """Append the file's processes to table ``procs`` (numbered from ``first``); return their metadata."""
    source = str(file).replace("'", "''")
    try:
        con.execute(f"""INSERT INTO procs SELECT {first} + unnest(range(len(t))) AS p, unnest(t) AS proc, $file
            FROM (SELECT "rocprofiler-sdk-tool" AS t FROM read_json('{source}', format='unstructured',
                  maximum_object_size=4000000000, columns={{'rocprofiler-sdk-tool': '{_PROCESS}'}}))""",
                    {"file": str(file)})
        rows = con.execute("""SELECT p, proc.metadata.pid, proc.metadata.node.hostname,
                                     list_filter(proc.agents, lambda a: a.type = 2)
                              FROM procs WHERE p >= $first ORDER BY p""", {"first": first}).fetchall()
    except (duckdb.Error, UnicodeDecodeError) as exc:
        raise TraceanaError(f"{file}: not a readable rocprofv3 JSON ({first_line(exc)})") from None
    if not rows:
        raise TraceanaError(f"{file}: a rocprofv3 JSON without processes (rocprofiler-sdk-tool is empty)")
    return [{"p": p, "pid": pid, "host": host, "gpus": gpus or []} for p, pid, host, gpus in rows]


def read(paths: list[Path], options: IngestOptions) -> RunData:
    """The run: every process of every file one rank, in the store's tables."""
    files = [f for p in paths for f in _files(p)]
    if not files:
        raise TraceanaError(f"{paths[0]}: no rocprofv3 JSON files (*.json, *.json.gz) here")
    require_distinct(files)
    options.progress.files(files)
    con = duckdb.connect()
    con.execute("CREATE TEMP TABLE procs (p INTEGER, proc " + _PROCESS.removesuffix("[]") + ", file VARCHAR)")
    procs: list[dict] = []
    for file in files:
        found = _load(con, file, len(procs))
        named = rank_in_file_name(file.name) if len(found) == 1 else None
        procs += [{**proc, "file": file, "named": named} for proc in found]
        options.progress.read(file)
    options.progress.phase("classifying kernels and collectives")
    ranks = _ranks(procs)
    rank_of = pl.DataFrame({"p": [q["p"] for q in procs], "rank": ranks}, schema={"p": pl.Int32, "rank": pl.Int32})
    api = con.sql(_API_SQL).pl().with_columns(pl.col("p").cast(pl.Int32))
    events = _device_events(con.sql(_EVENTS_SQL).pl().with_columns(pl.col("p").cast(pl.Int32)), api, options)
    notes = _notes(procs, events)
    events = events.join(rank_of, on="p")
    comm = _collectives(events, api).join(rank_of, on="p")
    names = sorted({g["product_name"] for q in procs for g in q["gpus"] if g.get("product_name")})
    data = RunData(
        source_format="rocprofv3", sources=[str(f.resolve()) for f in files], world_size=max(ranks) + 1,
        tool_version="rocprofv3 JSON (rocprofiler-sdk)", notes=notes, device=", ".join(names) or None,
        rank_source=",".join(sorted({"file-name" if q["named"] is not None else "file-order" for q in procs})),
        frames={
            "ranks": pl.DataFrame(
                {"rank": ranks, "host": [q["host"] for q in procs], "pid": [q["pid"] for q in procs],
                 "clock_offset_ns": [0] * len(procs), "source": [str(q["file"]) for q in procs],
                 "rank_source": ["file-name" if q["named"] is not None else "file-order" for q in procs]}),
            "device_events": events.drop("p"),
            "collectives": comm.drop("p"),
        })
    return data


def _ranks(procs: list[dict]) -> list[int]:
    """The file name's rank where a one-process file states one, else the lowest free rank in file and process
    order (rocprofv3 records no rank: ``-o %rank%_...`` or one folder per rank makes it known)."""
    taken = {q["named"] for q in procs if q["named"] is not None}
    free = (r for r in range(len(procs) + len(taken) + 1) if r not in taken)
    return [q["named"] if q["named"] is not None else next(free) for q in procs]


def _device_events(raw: pl.DataFrame, api: pl.DataFrame, options: IngestOptions) -> pl.DataFrame:
    """device_events (plus p, corr): numbered per process in time order, classified by name (copies are
    memcpy), each with the start of the HIP call that queued it (launch_ns)."""
    launches = api.filter(pl.col("api") == "hip").group_by("p", "corr").agg(
        pl.col("start_ns").min().alias("launch_ns"), pl.col("tid").first())
    events = raw.sort("p", "start_ns", "end_ns", "name").with_columns(
        (pl.int_range(pl.len()).over("p")).cast(pl.Int64).alias("event_id"))
    events = with_classes(events, "name", options.rules).with_columns(
        pl.when(pl.col("copy")).then(pl.lit("memcpy")).otherwise(pl.col("category")).alias("category"))
    return events.join(launches, on=["p", "corr"], how="left").select(
        "p", "event_id", pl.col("stream").cast(pl.Int64), "start_ns", "end_ns", "name", "category", "launch_ns",
        "rule_op", "corr", "tid", "agent")


def _collectives(events: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """One row per communication kernel: the op its name states (ncclDevKernel_AllReduce_...), else the RCCL
    API call around its launch (evidence 'op-only': rocprofv3 records no group), else Unknown (name-rule)."""
    comm = events.filter(pl.col("category") == "comm")
    parsed = {n: parse_nccl_kernel(n) for n in comm["name"].unique().to_list()}  # per name, not per event
    comm = comm.with_columns(
        pl.col("name").replace_strict({n: p[0] for n, p in parsed.items()}, return_dtype=pl.String).alias("kernel_op"),
        pl.col("name").replace_strict({n: p[1] for n, p in parsed.items()}, return_dtype=pl.String).alias("dtype"))
    rccl = api.filter(pl.col("api") == "rccl").select("p", "tid", pl.col("start_ns").alias("r_start"),
                                                      pl.col("end_ns").alias("r_end"), pl.col("name").alias("rccl"))
    # the innermost RCCL call open on the launching thread when the launch ran: the latest to start before it
    launched = comm.filter(pl.col("launch_ns").is_not_null()).select("p", "event_id", "tid", "launch_ns")
    around = launched.sort("launch_ns").join_asof(
        rccl.sort("r_start"), left_on="launch_ns", right_on="r_start", by=["p", "tid"], strategy="backward",
        check_sortedness=False).filter(pl.col("r_end") >= pl.col("launch_ns"))
    comm = comm.join(around.select("p", "event_id", "rccl"), on=["p", "event_id"], how="left")
    name_op = pl.coalesce(pl.col("rule_op"), pl.col("kernel_op").replace({"Generic": None}))
    rccl_op = pl.col("rccl").map_elements(canonical_op, return_dtype=pl.String)
    return comm.select(
        "p", "event_id",
        pl.coalesce(name_op, rccl_op, pl.lit("Unknown")).alias("op"), "kernel_op", "dtype",
        pl.when(name_op.is_not_null()).then(pl.lit("name-rule")).when(rccl_op.is_not_null()).then(pl.lit("op-only"))
        .otherwise(pl.lit("name-rule")).alias("evidence"),
        "stream", "start_ns", "end_ns")


def _notes(procs: list[dict], events: pl.DataFrame) -> list[str]:
    """What the files leave open: processes without device work, processes driving several GPUs."""
    notes = []
    busy = set(events["p"].unique().to_list())
    if idle := [f"{q['file'].name} pid {q['pid']}" for q in procs if q["p"] not in busy]:
        notes.append(f"{len(idle)} processes recorded no kernel or copy (ranks without device events): "
                     + ", ".join(idle[:5]))
    agents = events.filter(~pl.col("category").eq("memcpy")).group_by("p").agg(pl.col("agent").n_unique())
    for p, n in agents.filter(pl.col("agent") > 1).rows():
        notes.append(f"{procs[p]['file'].name} pid {procs[p]['pid']} ran kernels on {n} GPUs: read as one rank")
    return notes
