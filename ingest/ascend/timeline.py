"""Ascend timeline JSON (torch_npu / MindSpore trace_view.json, msprof_*.json and its msprof_slice_* parts).

The file is a bare JSON array of Chrome-trace events whose ``ts`` are strings of microseconds with three decimals.
DuckDB reads it into typed columns and everything after is SQL: ``ts`` goes through DECIMAL to integer ns exactly
(a float64 of an epoch in µs keeps only ~0.25 µs); tracks are resolved by their process_name / thread_name
metadata, never by pid arithmetic, because the pid schemes of profiler versions differ. HCCL plane threads belong
to the "Group … Communication" thread before them in thread_sort_index order.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import polars as pl

from traceana.errors import TraceanaError, first_line
from traceana.ingest.ascend.memory import memory_from_csv
from traceana.ingest.ascend.tasks import (
    RankTrace,
    hccl_task_annotations,
    hcom_columns,
    rank_events,
    with_task_categories,
)
from traceana.ingest.kineto.events import PHASES
from traceana.ingest.rules import Rule
from traceana.ingest.step_windows import marker_steps

DEFAULT_STEP_MARKER = r"^ProfilerStep#(\d+)$"

_COLUMNS = "{ph: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'VARCHAR', dur: 'VARCHAR', " \
           "cat: 'VARCHAR', args: 'JSON'}"
_HCCL_PROCESSES = "('HCCL', 'Communication')"  # older msprof named the HCCL layer "Communication"

_TRACKS_SQL = """
CREATE TEMP TABLE tracks AS
WITH meta AS (SELECT DISTINCT pid, tid, name, args FROM ev WHERE ph = 'M'),  -- slices repeat the metadata
process AS (SELECT pid, min(args->>'$.name') AS process FROM meta  -- a name that is no string names nothing
            WHERE name = 'process_name' AND json_type(args->'$.name') = 'VARCHAR' GROUP BY pid),
labels AS (SELECT pid, min(args->>'$.labels') AS labels FROM meta WHERE name = 'process_labels' GROUP BY pid),
thread AS (SELECT pid, tid, min(args->>'$.name') AS thread FROM meta
           WHERE name = 'thread_name' AND json_type(args->'$.name') = 'VARCHAR' GROUP BY pid, tid),
sort AS (SELECT pid, tid, min(TRY_CAST(args->>'$.sort_index' AS BIGINT)) AS sort_index FROM meta
         WHERE name = 'thread_sort_index' GROUP BY pid, tid)
SELECT pid, tid, process, labels, thread, coalesce(sort_index, TRY_CAST(tid AS BIGINT)) AS sort_index
FROM (SELECT DISTINCT pid, tid FROM ev) LEFT JOIN process USING (pid) LEFT JOIN labels USING (pid)
LEFT JOIN thread USING (pid, tid) LEFT JOIN sort USING (pid, tid)
"""

# A time or duration no clock produces (|ts| past 2^62 ns, |dur| past 2^61 ns) is NULL here, so start + dur cannot
# overflow; validation then leaves the span out with a note. A span without dur is an instant.
_SPANS_SQL = f"""
CREATE TEMP TABLE x AS
SELECT t.process, t.thread, t.pid, t.tid, t.sort_index, e.name, e.cat, e.args, start_ns,
       CASE WHEN e.dur IS NULL THEN 0 WHEN dur_raw BETWEEN -{2**61} AND {2**61} THEN dur_raw END AS dur_ns
FROM ev e JOIN tracks t USING (pid, tid),
     LATERAL (SELECT TRY_CAST(TRY_CAST(e.ts AS DECIMAL(20, 3)) * 1000 AS BIGINT) AS start_raw,
                     TRY_CAST(round(TRY_CAST(e.dur AS DOUBLE) * 1000) AS BIGINT) AS dur_raw),
     LATERAL (SELECT CASE WHEN start_raw BETWEEN -{2**62} AND {2**62} THEN start_raw END AS start_ns)
WHERE e.ph = 'X'  -- a ts that is no number is a NULL start: validation leaves the span out with a note
"""

_HARDWARE_SQL = r"""
SELECT start_ns, start_ns + dur_ns AS end_ns, name,
       coalesce(TRY_CAST(regexp_extract(thread, '^Stream (\d+)$', 1) AS BIGINT),
                TRY_CAST(coalesce(args->>'$."Physic Stream Id"', args->>'$."Stream Id"') AS BIGINT)) AS stream
FROM x WHERE process = 'Ascend Hardware'
"""

_GROUP_THREADS = f"""
SELECT pid, tid, sort_index, regexp_extract(thread, '^Group (.*) Communication$', 1) AS grp FROM tracks
WHERE process IN {_HCCL_PROCESSES} AND regexp_matches(thread, '^Group .* Communication$')
"""

_HCOM_SQL = f"""
SELECT x.start_ns, x.start_ns + x.dur_ns AS end_ns, x.name, 'comm' AS category, NULL::BIGINT AS stream,
       x.args->>'$.data_type' AS hccl_dtype, TRY_CAST(x.args->>'$.count' AS BIGINT) AS count,
       NULL::VARCHAR AS comm
FROM x JOIN ({_GROUP_THREADS}) g USING (pid, tid)
"""

_PLANE_SQL = rf"""
WITH planes AS (
    SELECT x.*, g.grp, g.tid AS group_tid, TRY_CAST(regexp_extract(x.thread, '^Plane (\d+)$', 1) AS INTEGER) AS plane
    FROM x ASOF JOIN ({_GROUP_THREADS}) g ON x.pid = g.pid AND x.sort_index >= g.sort_index
    WHERE x.process IN {_HCCL_PROCESSES} AND regexp_matches(x.thread, '^Plane \d+$')
), ops AS (
    SELECT pid, tid, start_ns, name FROM x WHERE process IN {_HCCL_PROCESSES} AND regexp_matches(thread, '^Group ')
)
SELECT p.start_ns, p.start_ns + p.dur_ns AS end_ns, p.name, p.grp AS "group", p.plane, o.name AS op,
       p.args->>'$."task type"' AS task_type,
       nullif(TRY_CAST(p.args->>'$."src rank"' AS BIGINT), 4294967295) AS src_rank,
       nullif(TRY_CAST(p.args->>'$."dst rank"' AS BIGINT), 4294967295) AS dst_rank,
       p.args->>'$."transport type"' AS transport, p.args->>'$."link type"' AS link_type,
       TRY_CAST(p.args->>'$."size(Byte)"' AS BIGINT) AS size_bytes,
       TRY_CAST(p.args->>'$."bandwidth(GB/s)"' AS DOUBLE) AS bandwidth_GBps,
       p.args->>'$.notify_id' AS notify_id, TRY_CAST(p.args->>'$."stream id"' AS BIGINT) AS stream
FROM planes p ASOF LEFT JOIN ops o ON o.pid = p.pid AND o.tid = p.group_tid AND p.start_ns >= o.start_ns
"""

# Events no query below reads, though they are of kinds it reads: damaged (a ph no phase, a span on a track no
# metadata names, an HCCL span on neither a group nor a plane thread, a Python span of no category torch_npu writes).
_PYTHON_CATEGORIES = ("cpu_op", "python_function", "enqueue", "dequeue", "user_annotation", "gpu_user_annotation")
_UNREAD_SQL = rf"""
SELECT (SELECT count(*) FROM ev WHERE ph IS NULL OR ph NOT IN {PHASES}),
       (SELECT count(*) FROM ev LEFT JOIN tracks t USING (pid, tid) WHERE ev.ph = 'X' AND t.process IS NULL),
       (SELECT count(*) FROM x WHERE process IN {_HCCL_PROCESSES}
            AND NOT coalesce(regexp_matches(thread, '^Group .* Communication$|^Plane \d+$'), false)),
       (SELECT count(*) FROM x WHERE process = 'Python' AND coalesce(cat, '') NOT IN {_PYTHON_CATEGORIES})
"""
_UNREAD = ("events left out: their ph is missing or no phase the Trace Event Format defines",
           "spans left out: no process_name metadata names their process (a pid missing, or its name no string)",
           "HCCL spans left out: on threads named neither 'Group ... Communication' nor 'Plane N'",
           "Python spans left out: their cat is missing or none torch_npu writes")

_CPU_OPS_SQL = """
SELECT start_ns, start_ns + dur_ns AS end_ns, name, 'Python' AS domain, 'cpu_op' AS kind, NULL::VARCHAR AS args
FROM x WHERE process = 'Python' AND cat = 'cpu_op'
"""


def _load(con: duckdb.DuckDBPyConnection, files: list[Path]) -> None:
    for file in files:
        if file.stat().st_size == 0:
            raise TraceanaError(f"{file}: the file is empty")
    listing = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
    try:
        con.execute(f"CREATE TEMP TABLE ev AS SELECT * FROM read_json([{listing}], format='array', "
                    f"columns={_COLUMNS}, maximum_object_size=1073741824)")
    except (duckdb.Error, UnicodeDecodeError) as exc:  # DuckDB may fail to decode its own message
        where = files[0] if len(files) == 1 else f"{files[0].parent} (msprof slices)"
        detail = first_line(exc, 160)
        raise TraceanaError(f"{where}: not a complete JSON array of trace events ({detail})") from None


def read_timeline(files: list[Path], rules: list[Rule], step_marker: str | None) -> RankTrace:
    """Parse one rank's timeline (one file, or all msprof slices of one export)."""
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    _load(con, files)
    con.execute(_TRACKS_SQL)
    hardware = con.execute("SELECT pid, any_value(labels) FROM tracks WHERE process = 'Ascend Hardware' "
                           "GROUP BY pid").fetchall()
    if not hardware:
        raise TraceanaError(f"{files[0]}: no 'Ascend Hardware' track in the timeline (not an Ascend device profile)")
    if len(hardware) > 1:
        raise TraceanaError(f"{files[0]}: holds the timelines of {len(hardware)} devices; export and ingest one "
                            f"timeline per device (rank)")
    con.execute(_SPANS_SQL)

    tasks = with_task_categories(con.sql(_HARDWARE_SQL).pl(), rules)
    hcom = hcom_columns(con.sql(_HCOM_SQL).pl())
    events = rank_events(tasks, hcom)
    annotations = con.sql(_CPU_OPS_SQL).pl()
    planes = con.sql(_PLANE_SQL).pl()
    if not planes.is_empty():
        annotations = pl.concat([annotations, hccl_task_annotations(planes)])
    python = con.execute("SELECT min(pid) FROM tracks WHERE process = 'Python'").fetchall()[0][0]
    device = re.search(r"(\d+)", hardware[0][1] or "")
    unread = con.execute(_UNREAD_SQL).fetchall()[0]
    notes: list[str] = [f"{files[0]}: {n:,} {what}" for n, what in zip(unread, _UNREAD, strict=True) if n]
    return RankTrace(
        source=files[0], events=events, annotations=annotations,
        steps=marker_steps(annotations.filter(pl.col("kind") == "cpu_op"), step_marker or DEFAULT_STEP_MARKER),
        device=_id(device.group(1), 32) if device else None,
        pid=_id(python, 64),
        memory=memory_from_csv(files[0].parent / "memory_record.csv", notes), notes=notes,
    )


def _id(text: str | None, bits: int) -> int | None:
    """A device or process id from a label; None when there is none, or it is a sentinel no id column holds."""
    return int(text) if text and text.isdigit() and int(text) < 2 ** (bits - 1) and int(text) != 4294967295 else None
