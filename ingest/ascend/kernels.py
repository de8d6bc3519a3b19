"""A torch_npu text export without its timeline (trace_view.json, the file users drop first: it is the big one):
the device tasks of kernel_details.csv and the HCCL ops of communication.json.

kernel_details.csv holds one row per task the profiler's Computing unions (AI_CORE, AI_VECTOR_CORE, MIX_AIC/AIV,
AI_CPU, DSA) and one per HCCL op (Accelerator Core HCCL), each with its Step Id, stream, start (µs as text with up
to three decimals, read exactly through DECIMAL) and duration. communication.json holds every HCCL op of every step
with its group hash (``op@hash``): where the export has it, the ops are its entries, and kernel_details' HCCL rows
(the same ops, which a cut-down file may lack) are left out and counted; without it (profiler level 0) those rows
are the ops, with no communicator evidence. What the export does not hold is not made up: no host side (CPU ops,
launches), no runtime tasks (copies, event records and waits, so no syncs), no HCCL plane tasks. A step is its
tasks' span, first start to last end: the span over which step_trace_time.csv measures Free; the Preparing before
it needs the host side.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

from traceana.errors import TraceanaError, first_line
from traceana.ingest.ascend.groups import communication_keys
from traceana.ingest.ascend.memory import memory_from_csv
from traceana.ingest.ascend.tasks import RankTrace, hcom_columns, rank_events, with_task_categories
from traceana.ingest.rules import Rule
from traceana.ingest.run_data import SCHEMAS

_COLUMNS = ("Name", "Accelerator Core", "Start Time(us)", "Duration(us)")
_OPTIONAL = {"step": "Step Id", "stream": "Stream ID"}  # profiler level 0 writes no Stream ID
_HCCL = "HCCL"  # the Accelerator Core of an HCCL op's row

# Not sniffed (a short row misleads the sniffer); rejected rows are recorded, not fatal.
_CSV = "header = true, all_varchar = true, delim = ',', quote = '\"', escape = '\"', store_rejects = true"
# Both read exactly as decimals (a duration may have a fourth decimal: half a ns, rounded away from zero). A time no
# clock produces (past 2^62 ns) or a duration past 2^61 ns is NULL here, so start + duration cannot overflow;
# validation then leaves the row out with a note. Newer files end each start with a TAB.
_ROWS_SQL = f"""
SELECT start_ns, start_ns + dur_ns AS end_ns, "Name" AS name, "Accelerator Core" AS core,
       TRY_CAST({{stream}} AS BIGINT) AS stream, TRY_CAST({{step}} AS INTEGER) AS step
FROM read_csv('{{path}}', {_CSV}),
     LATERAL (SELECT TRY_CAST(TRY_CAST(trim("Start Time(us)") AS DECIMAL(20, 3)) * 1000 AS BIGINT) AS start_raw,
                     TRY_CAST(round(TRY_CAST(trim("Duration(us)") AS DECIMAL(24, 6)) * 1000) AS BIGINT) AS dur_raw),
     LATERAL (SELECT CASE WHEN start_raw BETWEEN 0 AND {2**62} THEN start_raw END AS start_ns,
                     CASE WHEN dur_raw BETWEEN 0 AND {2**61} THEN dur_raw END AS dur_ns)
"""


def _rows(path: Path, notes: list[str]) -> pl.DataFrame:
    """kernel_details.csv's rows; those the CSV reader rejects (a row of too few fields) are counted in a note."""
    source = str(path).replace("'", "''")
    con = duckdb.connect()
    try:
        header = [r[0] for r in con.sql(f"DESCRIBE SELECT * FROM read_csv('{source}', {_CSV})").fetchall()]
        if lacking := [c for c in _COLUMNS if c not in header]:
            raise TraceanaError(f"{path}: lacks the column{'s' * (len(lacking) > 1)} {', '.join(lacking)}")
        optional = {key: f'"{column}"' if column in header else "NULL" for key, column in _OPTIONAL.items()}
        rows = con.sql(_ROWS_SQL.format(path=source, **optional)).pl()
        rejected = con.execute("SELECT count(*), min(line), any_value(error_message) FROM reject_errors").fetchone()
    except (duckdb.Error, UnicodeDecodeError) as exc:  # DuckDB may fail to decode its own message
        raise TraceanaError(f"{path}: not a readable CSV ({first_line(exc, 160)})") from None
    finally:
        con.close()
    if rejected and rejected[0]:
        notes.append(f"{path}: {rejected[0]} rows left out, the CSV reader rejects them (line {rejected[1]}: "
                     f"{rejected[2]})")
    return rows


def _ops(communication: Path, path: Path, hccl_rows: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """HCCL ops (start_ns, end_ns, name, step, group_hash) from communication.json; its entries without a start or
    an elapsed time, and the kernel_details HCCL rows it stands for, are counted in notes."""
    keys = communication_keys(communication)
    if untimed := keys["end_ns"].null_count():  # NULL wherever the start or the elapse time is
        notes.append(f"{communication}: {untimed} ops without a start or an elapse time left out")
    ops = keys.drop_nulls(["start_ns", "end_ns"]).rename({"op_name": "name"})
    if not hccl_rows.is_empty():
        both = hccl_rows.join(ops, on="name", how="left", suffix="_json")
        apart = pl.max_horizontal((pl.col(c) - pl.col(f"{c}_json")).abs() for c in ("start_ns", "end_ns"))
        differ = both.filter(apart.fill_null(2**62) > 1_000).height
        notes.append(f"{path}: its {hccl_rows.height} HCCL rows left out, the ops are "
                     f"communication.json's ({differ} of those rows missing there or > 1 µs off in start or end)")
    return ops


def read_kernel_details(path: Path, communication: Path | None, rules: list[Rule]) -> RankTrace:
    """Parse one rank's kernel_details.csv (and communication.json beside it, when the export has one)."""
    notes: list[str] = []
    rows = _rows(path, notes)
    is_op = pl.col("core").eq_missing(_HCCL)
    hccl, tasks = rows.filter(is_op), with_task_categories(rows.filter(~is_op), rules)
    if communication is not None:
        ops = _ops(communication, path, hccl, notes)
    else:
        ops = hccl.select("start_ns", "end_ns", "name", "step")
    hcom = hcom_columns(ops.with_columns(category=pl.lit("comm"), hccl_dtype=pl.lit(None, pl.String()),
                                         count=pl.lit(None, pl.Int64())))
    steps = (pl.concat([tasks.select("step", "start_ns", "end_ns"), ops.select("step", "start_ns", "end_ns")])
             .drop_nulls().group_by("step").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort("step"))
    annotations = pl.DataFrame(schema={c: t for c, t in SCHEMAS["annotations"].items() if c != "rank"})  # none
    return RankTrace(source=path, events=rank_events(tasks, hcom), annotations=annotations, steps=steps,
                     memory=memory_from_csv(path.parent / "memory_record.csv", notes), notes=notes,
                     tool_version="text export without trace_view.json")
