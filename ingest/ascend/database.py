"""Ascend database export: ascend_pytorch_profiler_{rank}.db, ascend_mindspore_profiler_*.db, msprof_*.db.

SQLite with times already in integer ns and every string interned in STRING_IDS. Compute tasks are TASK rows with
a COMPUTE_TASK_INFO row (the set the profiler's Computing unions), HCCL ops are COMMUNICATION_OP (groupName is the
communicator name), their tasks COMMUNICATION_TASK_INFO; other TASK rows are runtime tasks (events, copies) when
their task type says so. Kernel-typed TASK rows without operator info are containers the text export also omits.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.ascend.memory import EMPTY as NO_MEMORY
from traceana.ingest.ascend.memory import SCHEMA as MEMORY_SCHEMA
from traceana.ingest.ascend.tasks import (
    RUNTIME_TASKS,
    RankTrace,
    hccl_task_annotations,
    hcom_columns,
    rank_events,
    with_task_categories,
)
from traceana.ingest.ascend.timeline import DEFAULT_STEP_MARKER
from traceana.ingest.profiler_sqlite import ProfilerSqlite, unknown_id
from traceana.ingest.rules import Rule
from traceana.ingest.step_windows import marker_steps
from traceana.ingest.validate import checked_rank

SCHEMA_MAJOR = "1"  # the schema family read here (META_DATA SCHEMA_VERSION 1.x)

# Tables and columns this reader needs; a database without them is of a schema it does not know.
_REQUIRED = {
    "STRING_IDS": ("id", "value"),
    "TASK": ("startNs", "endNs", "globalTaskId", "streamId", "taskType"),
    "COMPUTE_TASK_INFO": ("name", "globalTaskId"),
}
# Tables read where present, by their columns rather than the schema version (msprof's COMMUNICATION_OP has no
# dataType or count): the columns a row cannot do without (a table lacking them is an unknown schema, or skipped
# when it holds no row), and the columns read as NULL where a version lacks them.
_OPTIONAL = {
    "COMMUNICATION_OP": (("opName", "startNs", "endNs"), ("groupName", "dataType", "count", "opId")),
    "COMMUNICATION_TASK_INFO": (("globalTaskId", "taskType"),
                                ("name", "planeId", "groupName", "srcRank", "dstRank", "transportType", "size",
                                 "linkType", "notifyId", "opId")),
}

_COMPUTE_SQL = """
SELECT t.startNs AS start_ns, t.endNs AS end_ns, s.value AS name, {stream} AS stream
FROM TASK t JOIN COMPUTE_TASK_INFO c ON c.globalTaskId = t.globalTaskId JOIN STRING_IDS s ON s.id = c.name
"""
_RUNTIME_SQL = """
SELECT t.startNs AS start_ns, t.endNs AS end_ns, s.value AS name, {stream} AS stream
FROM TASK t LEFT JOIN STRING_IDS s ON s.id = t.taskType
WHERE t.globalTaskId NOT IN (SELECT globalTaskId FROM COMPUTE_TASK_INFO) {not_comm_task}
"""
_HCOM_SQL = """
SELECT o.startNs AS start_ns, o.endNs AS end_ns, n.value AS name, 'comm' AS category, NULL AS stream,
       {dtype} AS hccl_dtype, {count} AS count, g.value AS comm
FROM COMMUNICATION_OP o JOIN STRING_IDS n ON n.id = o.opName LEFT JOIN STRING_IDS g ON g.id = {group}
{dtype_join}
"""
_HCCL_TASK_SQL = """
SELECT t.startNs AS start_ns, t.endNs AS end_ns, ty.value AS name, g.value AS "group", {plane} AS plane,
       op.value AS op, ty.value AS task_type, {src} AS src_rank, {dst} AS dst_rank, {transport} AS transport,
       {link} AS link_type, {size} AS size_bytes,
       CASE WHEN t.endNs > t.startNs THEN CAST({size} AS REAL) / (t.endNs - t.startNs) END AS bandwidth_GBps,
       CAST({notify} AS TEXT) AS notify_id, {stream} AS stream
FROM COMMUNICATION_TASK_INFO c JOIN TASK t ON t.globalTaskId = c.globalTaskId
LEFT JOIN STRING_IDS ty ON ty.id = c.taskType LEFT JOIN STRING_IDS g ON g.id = {group_task}
LEFT JOIN STRING_IDS op ON op.id = {op_name} {joins}
"""


def _ids(db: _Database) -> dict[str, str]:
    """The SQL of the columns the queries above read, NULL where this database's version lacks the column. Ids
    that may hold the profiler's "none" (uint32 -1) are read through unknown_id: NULL, not an overflow."""
    op, task = partial(db.col, "COMMUNICATION_OP", "o"), partial(db.col, "COMMUNICATION_TASK_INFO", "c")
    return {"stream": unknown_id("t.streamId"), "count": unknown_id(op("count")), "group": op("groupName"),
            "plane": unknown_id(task("planeId"), 32), "src": unknown_id(task("srcRank"), 32),
            "dst": unknown_id(task("dstRank"), 32), "size": unknown_id(task("size")), "notify": task("notifyId"),
            "group_task": task("groupName"), "op_name": task("name")}


_CPU_OPS_SQL = """
SELECT CAST(p.startNs AS INTEGER) AS start_ns, CAST(p.endNs AS INTEGER) AS end_ns, s.value AS name,
       'Python' AS domain, 'cpu_op' AS kind, NULL AS args
FROM PYTORCH_API p JOIN STRING_IDS s ON s.id = p.name {op_type}
"""


class _Database(ProfilerSqlite):
    """An Ascend database export, read-only (profiler_sqlite.ProfilerSqlite), with its ENUM tables."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "the database")
        self.open_arrow()

    def col(self, table: str, alias: str, column: str) -> str:
        """``alias.column``, or NULL where ``table`` lacks that column."""
        return f"{alias}.{column}" if self.has(table, (column,)) else "NULL"

    def readable(self, table: str) -> bool:
        """One of the _OPTIONAL tables, present with the columns its rows need (_check_schema refuses one that
        lacks them and holds rows)."""
        return self.has(table, _OPTIONAL[table][0])

    def enum(self, table: str, column: str) -> tuple[str, str]:
        """(value expression, join) resolving ``column`` through ENUM table ``table`` when the database has it."""
        if column == "NULL" or not self.has(table, ("id", "name")):
            return f"CAST({column} AS TEXT)", ""
        alias = f"e_{table.lower()}"
        return f"{alias}.name", f" LEFT JOIN {table} {alias} ON {alias}.id = {column}"


def _check_schema(db: _Database) -> str:
    """The schema version, after making sure the tables this reader needs are there."""
    version = "unknown"
    if db.has("META_DATA", ("name", "value")):
        found = db.rows("SELECT value FROM META_DATA WHERE name = 'SCHEMA_VERSION'")
        version = found[0][0] if found else version
        if found and str(version).split(".")[0] != SCHEMA_MAJOR:
            raise TraceanaError(f"{db.path}: database schema version {version} is not supported "
                                f"(traceana reads {SCHEMA_MAJOR}.x)")
    needed = {**_REQUIRED, **{t: c[0] for t, c in _OPTIONAL.items() if t in db.tables}}
    for table, columns in needed.items():
        lacking = sorted(set(columns) - set(db.columns(table)))
        problem = f"no {table} table" if table not in db.tables else f"{table} lacks {', '.join(lacking)}"
        if lacking and (table in _REQUIRED or db.scalar(f'SELECT count(*) FROM "{table}"')):
            raise TraceanaError(f"{db.path}: unknown Ascend database schema (version {version}): {problem}")
    return version


_EVENT = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(), "stream": pl.Int64()}
_HCOM = {**_EVENT, "category": pl.String(), "hccl_dtype": pl.String(), "count": pl.Int64(), "comm": pl.String()}
_HCCL_TASK = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(), "group": pl.String(),
              "plane": pl.Int32(), "op": pl.String(), "task_type": pl.String(), "src_rank": pl.Int64(),
              "dst_rank": pl.Int64(), "transport": pl.String(), "link_type": pl.String(), "size_bytes": pl.Int64(),
              "bandwidth_GBps": pl.Float64(), "notify_id": pl.String(), "stream": pl.Int64()}
_ANNOTATION = {"start_ns": pl.Int64(), "end_ns": pl.Int64(), "name": pl.String(), "domain": pl.String(),
               "kind": pl.String(), "args": pl.String()}


def _events(db: _Database, rules: list[Rule]) -> pl.DataFrame:
    ids = _ids(db)
    compute = db.query(_COMPUTE_SQL.format(**ids), _EVENT, "TASK/COMPUTE_TASK_INFO")
    comm_task = "AND t.globalTaskId NOT IN (SELECT globalTaskId FROM COMMUNICATION_TASK_INFO)" \
        if db.readable("COMMUNICATION_TASK_INFO") else ""
    other = db.query(_RUNTIME_SQL.format(**ids, not_comm_task=comm_task), _EVENT, "TASK")
    runtime = pl.col("name").is_in([k for k, v in RUNTIME_TASKS.items() if v])
    left = other.filter(~runtime.fill_null(False))  # kernel-typed containers the text export omits too
    if left.height:
        types = left.group_by("name").len().sort("len", "name", descending=[True, False]).head(3).rows()
        db.notes.append(f"{db.path}: {left.height} TASK rows left out, neither compute (COMPUTE_TASK_INFO), HCCL "
                        f"(COMMUNICATION_TASK_INFO) nor a runtime task ({', '.join(f'{t} {n}' for t, n in types)}"
                        f"{' ...' if left['name'].n_unique() > 3 else ''})")
    tasks = with_task_categories(pl.concat([compute, other.filter(runtime)]), rules)
    hcom = pl.DataFrame(schema=_HCOM)
    if db.readable("COMMUNICATION_OP"):
        dtype, join = db.enum("ENUM_HCCL_DATA_TYPE", db.col("COMMUNICATION_OP", "o", "dataType"))
        hcom = db.query(_HCOM_SQL.format(**ids, dtype=dtype, dtype_join=join), _HCOM, "COMMUNICATION_OP")
    return rank_events(tasks, hcom_columns(hcom))


def _annotations(db: _Database) -> pl.DataFrame:
    """PyTorch operators (cpu_op) and HCCL tasks (hccl_task)."""
    annotations = pl.DataFrame(schema=_ANNOTATION)
    if db.has("PYTORCH_API", ("startNs", "endNs", "name")):
        op_type = ""
        if db.has("PYTORCH_API", ("type",)) and db.has("ENUM_API_TYPE", ("id", "name")):
            op_type = "WHERE p.type IN (SELECT id FROM ENUM_API_TYPE WHERE name = 'op')"
        annotations = db.query(_CPU_OPS_SQL.format(op_type=op_type), _ANNOTATION, "PYTORCH_API")
    if db.readable("COMMUNICATION_TASK_INFO"):
        transport, join_t = db.enum("ENUM_HCCL_TRANSPORT_TYPE", db.col("COMMUNICATION_TASK_INFO", "c", "transportType"))
        link, join_l = db.enum("ENUM_HCCL_LINK_TYPE", db.col("COMMUNICATION_TASK_INFO", "c", "linkType"))
        sql = _HCCL_TASK_SQL.format(**_ids(db), transport=transport, link=link, joins=join_t + join_l)
        tasks = db.query(sql, _HCCL_TASK, "COMMUNICATION_TASK_INFO")
        annotations = pl.concat([annotations, hccl_task_annotations(tasks)])
        if orphans := _tasks_without_op(db):
            db.notes.append(f"{db.path}: {orphans} HCCL tasks belong to no COMMUNICATION_OP row (the table holds "
                            f"{db.scalar('SELECT count(*) FROM COMMUNICATION_OP') or 0}); they are kept as "
                            "hccl_task annotations, their time is not communication in the breakdown")
    return annotations


def _tasks_without_op(db: _Database) -> int:
    """HCCL tasks (COMMUNICATION_TASK_INFO joined to TASK) whose opId names no COMMUNICATION_OP row."""
    if not db.has("COMMUNICATION_TASK_INFO", ("opId",)):
        return 0
    if db.has("COMMUNICATION_OP", ("opId",)):
        where = "WHERE c.opId NOT IN (SELECT opId FROM COMMUNICATION_OP WHERE opId IS NOT NULL)"
    elif "COMMUNICATION_OP" not in db.tables:
        where = ""
    else:
        return 0  # ops without ids: which task is whose cannot be told
    return int(db.scalar(f"SELECT count(*) FROM COMMUNICATION_TASK_INFO c JOIN TASK t USING (globalTaskId) {where}")
               or 0)


def _metadata(db: _Database) -> dict:
    """parallel_group_info and distributed_args from META_DATA, as profiler_metadata.json would hold them."""
    if not db.has("META_DATA", ("name", "value")):
        return {}
    rows = db.rows("SELECT name, value FROM META_DATA WHERE name IN ('parallel_group_info', 'distributed_args')")
    try:
        return {name: json.loads(value) for name, value in rows}
    except ValueError as exc:
        raise TraceanaError(f"{db.path}: META_DATA holds malformed JSON ({exc})") from None


def _memory(db: _Database) -> pl.DataFrame:
    """The PTA allocator samples. Memory is an extra: a table that cannot be read is left out with a note."""
    try:
        return db.query(
            f"SELECT m.timestamp AS ts_ns, {unknown_id('m.totalAllocated')} AS allocated_bytes, "
            f"{unknown_id('m.totalReserved')} AS reserved_bytes FROM MEMORY_RECORD m "
            "JOIN STRING_IDS s ON s.id = m.component WHERE s.value = 'PTA' ORDER BY m.timestamp",
            MEMORY_SCHEMA, "MEMORY_RECORD")
    except TraceanaError as exc:
        db.notes.append(f"{exc}; memory samples left out")
        return NO_MEMORY


_LINKS = (  # (what the rows are, their table, the column naming a row of another table, that table, its key)
    ("compute tasks", "COMPUTE_TASK_INFO", "name", "STRING_IDS", "id"),
    ("HCCL ops", "COMMUNICATION_OP", "opName", "STRING_IDS", "id"),
    ("COMPUTE_TASK_INFO rows", "COMPUTE_TASK_INFO", "globalTaskId", "TASK", "globalTaskId"),
    ("COMMUNICATION_TASK_INFO rows", "COMMUNICATION_TASK_INFO", "globalTaskId", "TASK", "globalTaskId"),
)


def _dangling(db: _Database) -> list[str]:
    """How many rows name a row their export lacks (a missing or cut-down table), which the joins leave out."""
    found: dict[str, list[str]] = {}
    for what, table, column, target, key in _LINKS:
        if db.has(table, (column,)) and target in db.tables:
            count = db.rows(f"SELECT count(*) FROM {table} x LEFT JOIN {target} y ON y.{key} = x.{column} "
                            f"WHERE y.{key} IS NULL")[0][0]
            found.setdefault(target, []).extend([f"{count} {what}"] if count else [])
    return [f"{' and '.join(rows)} name no {target} row" for target, rows in found.items() if rows]


def read_database(path: Path, rules: list[Rule], step_marker: str | None) -> RankTrace:
    """Parse one rank's database export."""
    db = _Database(path)
    try:
        return _rank_trace(db, rules, step_marker)
    finally:
        db.close()  # a run of a thousand ranks must not hold a thousand open files


def _rank_trace(db: _Database, rules: list[Rule], step_marker: str | None) -> RankTrace:
    path = db.path
    version = _check_schema(db)
    annotations = _annotations(db)
    if step_marker is None and db.has("STEP_TIME", ("id", "startNs", "endNs")):
        steps = db.query(f"SELECT {unknown_id('id', 32)} AS step, startNs AS start_ns, endNs AS end_ns FROM STEP_TIME",
                         {"step": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64()}, "STEP_TIME")
        if steps["step"].null_count():  # a step id that is the profiler's "none": number the steps by order
            steps = steps.sort("start_ns").with_columns(step=pl.int_range(pl.len(), dtype=pl.Int32()))
    else:
        steps = marker_steps(annotations.filter(pl.col("kind") == "cpu_op"), step_marker or DEFAULT_STEP_MARKER)
    trace = RankTrace(source=path, events=_events(db, rules), annotations=annotations, steps=steps,
                      pid=db.rows(f"SELECT min({unknown_id('globalPid')}) FROM TASK")[0][0], metadata=_metadata(db),
                      tool_version=f"database schema {version}")
    if dangling := _dangling(db):
        trace.notes.append(f"{path}: {'; '.join(dangling)} (a missing or cut-down table); they are left out")
    if db.has("MEMORY_RECORD", ("component", "timestamp", "totalAllocated", "totalReserved")):
        trace.memory = _memory(db)
    trace.notes.extend(db.notes)
    if db.has("RANK_DEVICE_MAP", ("rankId", "deviceId")):
        found = db.rows(f"SELECT rankId, {unknown_id('deviceId', 32)} FROM RANK_DEVICE_MAP")
        if len(found) > 1:
            raise TraceanaError(f"{path}: holds {len(found)} devices (RANK_DEVICE_MAP); ingest one database per rank")
        if found:
            trace.device = found[0][1]
            rank = checked_rank(found[0][0], str(path), "RANK_DEVICE_MAP.rankId")  # -1: a run without ranks
            if rank is not None:
                trace.rank, trace.rank_source = rank, "RANK_DEVICE_MAP"
    if trace.device is None and db.has("TASK", ("deviceId",)):  # msprof writes no RANK_DEVICE_MAP
        devices = [d for (d,) in db.rows(f"SELECT DISTINCT {unknown_id('deviceId', 32)} FROM TASK") if d is not None]
        if len(devices) > 1:
            raise TraceanaError(f"{path}: holds the tasks of {len(devices)} devices (TASK.deviceId); export and "
                                "ingest one database per device (rank)")
        trace.device = devices[0] if devices else None
    if db.has("HOST_INFO", ("hostName", "hostUid")):
        hosts = db.rows("SELECT hostName, hostUid FROM HOST_INFO")
        trace.host = f"{hosts[0][0]}#{hosts[0][1]}" if hosts else None  # the uid tells apart hosts of one name
    return trace
