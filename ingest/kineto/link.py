"""One Kineto file's device side, linked in SQL over the ``ev`` table (events.py): each kernel, copy and memset
with the runtime call that launched it (correlation id) and, for communication kernels, the innermost comm CPU op
around that call, which says the op, group, size and dtype where the kernel's own args do not; and the device step
windows, each event in the ProfilerStep whose CPU range held its launch."""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.ingest.comm_names import DTYPE_BYTES, canonical_dtype, canonical_op, parse_nccl_kernel
from traceana.ingest.kineto.events import FIRST_INPUT_NELEMS, STEP
from traceana.ingest.rules import Rule, with_classes
from traceana.ingest.scopes import open_ranges_sql
from traceana.ingest.step_windows import StepLinks, step_windows_of

_COMM_CPU_OPS = r"^(record_param_comms|nccl:|c10d::|gloo:)"
_SECOND_INPUT_NELEMS = FIRST_INPUT_NELEMS.replace("->0", "->1")

# The group size an op states ("Group size" args), else the one its shapes imply: the c10d base ops take
# (output, input), and a reduce-scatter's input or an all-gather's output is group size x the other.
_GROUP_SIZE = f"""coalesce(group_size, CASE
    WHEN name IN ('c10d::_reduce_scatter_base_', 'c10d::reduce_scatter_tensor')
         AND {FIRST_INPUT_NELEMS} > 0 AND {_SECOND_INPUT_NELEMS} % {FIRST_INPUT_NELEMS} = 0
        THEN {_SECOND_INPUT_NELEMS} // {FIRST_INPUT_NELEMS}
    WHEN name IN ('c10d::_allgather_base_', 'c10d::all_gather_into_tensor')
         AND {_SECOND_INPUT_NELEMS} > 0 AND {FIRST_INPUT_NELEMS} % {_SECOND_INPUT_NELEMS} = 0
        THEN {FIRST_INPUT_NELEMS} // {_SECOND_INPUT_NELEMS} END)"""

# Each device event's launching CPU op (by correlation id): the innermost cpu_op open on the launching runtime call's
# thread when the call ran, with the input shapes, dtypes and scalar arguments record_shapes=True writes (NULL
# without it). Ops of one thread nest, so a sweep finds it without a range join: an op opens (+1) at its start and
# closes (-1) at its end, a call at t lies inside the d ops open then, and the innermost is the last to open at depth
# d before t (ASOF). Ties: opens first (the longer first; of two with the same start and end, the smaller External id,
# the caller, which PyTorch numbers first), then calls, then closes, as an op's interval is closed.
# Newer traces also give the kernel that op's External id; older ones (2022) only the correlation. Both agree on
# every kernel of the shared H200 traces.
_OPS_SQL = """WITH launch AS (
    SELECT f, corr, arg_min(pid, start_ns) AS pid, arg_min(tid, start_ns) AS tid, min(start_ns) AS t FROM ev
    WHERE cat IN ('cuda_runtime', 'cuda_driver')
      AND corr IN (SELECT corr FROM ev WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset'))
    GROUP BY f, corr
), marks AS (
    SELECT f, pid, tid, start_ns AS t, 0 AS k, -end_ns AS tie, 1 AS delta, ext_id AS id FROM ev WHERE cat = 'cpu_op'
    UNION ALL SELECT f, pid, tid, end_ns, 2, 0, -1, NULL FROM ev WHERE cat = 'cpu_op'
    UNION ALL SELECT f, pid, tid, t, 1, 0, 0, corr FROM launch
), depth AS (
    SELECT *, sum(delta) OVER (PARTITION BY f, pid, tid ORDER BY t, k, tie, id ROWS UNBOUNDED PRECEDING) AS d
    FROM marks
), linked AS (
    SELECT c.f, c.id AS corr, o.id AS op_id
    FROM (SELECT * FROM depth WHERE k = 1 AND d > 0) c
    ASOF JOIN (SELECT * FROM depth WHERE k = 0) o ON o.f = c.f AND o.pid = c.pid AND o.tid = c.tid AND o.d = c.d
                                                  AND o.t <= c.t
)
SELECT l.f, l.corr, l.op_id, e.name AS launch_op, e.input_dims, e.input_type AS input_types,
       e.concrete AS concrete_inputs
FROM linked l JOIN ev e ON e.f = l.f AND e.ext_id = l.op_id AND e.cat = 'cpu_op'"""

# Each kernel's launch: the first runtime call of its correlation id (the host time it was queued).
_LAUNCHES_SQL = """SELECT f, corr, min(start_ns) AS launch_ns FROM ev
    WHERE cat IN ('cuda_runtime', 'cuda_driver') AND corr IS NOT NULL GROUP BY f, corr"""

# Each launch's scope (the event_scopes table): the outermost CPU op open on its thread (ProfilerStep excluded), the
# nn.Module path (the Python tracer's "nn.Module: X_0" ranges) and the phase: backward under autograd's engine.
_LAUNCH_POINTS = """(SELECT f, corr AS id, arg_min(pid, start_ns) AS pid, arg_min(tid, start_ns) AS tid,
    min(start_ns) AS t FROM ev WHERE cat IN ('cuda_runtime', 'cuda_driver')
    AND corr IN (SELECT corr FROM ev WHERE cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')) GROUP BY f, corr)"""
_CPU_OPS = f"(SELECT * FROM ev WHERE cat = 'cpu_op' AND NOT regexp_matches(name, '{STEP}'))"
_MODULES = ("(SELECT f, pid, tid, start_ns, end_ns, substr(name, 12) AS name FROM ev "
            "WHERE cat = 'python_function' AND starts_with(name, 'nn.Module: '))")
_SCOPES_SQL = f"""SELECT coalesce(o.f, m.f) AS f, coalesce(o.id, m.id) AS corr, o.outermost AS scope_op,
    m.path AS module, CASE WHEN starts_with(o.outermost, 'autograd::engine::') THEN 'backward' END AS phase
FROM ({open_ranges_sql(_CPU_OPS, _LAUNCH_POINTS, "f, pid, tid", outer_first="ext_id, name", path=False)}) o
FULL JOIN ({open_ranges_sql(_MODULES, _LAUNCH_POINTS, "f, pid, tid")}) m ON m.f = o.f AND m.id = o.id"""

_LAUNCHERS_SQL = f"""
-- For each communication kernel: the innermost comm CPU op around the runtime call that launched it.
WITH runtime AS (
    SELECT f, corr, pid, tid, start_ns FROM ev
    WHERE cat IN ('cuda_runtime', 'cuda_driver') AND corr IS NOT NULL
), host AS (
    SELECT f, pid, tid, start_ns, end_ns, name, coll_name, pg_name, seq, {_GROUP_SIZE} AS group_size,
           coalesce(in_nelems, {FIRST_INPUT_NELEMS}) AS in_nelems, coalesce(dtype, input_type->>0) AS dtype FROM ev
    WHERE cat IN ('cpu_op', 'user_annotation') AND regexp_matches(name, '{_COMM_CPU_OPS}')
), linked AS (
    SELECT k.f, k.start_ns AS k_start, k.corr, h.*, row_number() OVER (
        PARTITION BY k.f, k.corr, k.start_ns, h.name = 'record_param_comms' ORDER BY h.start_ns DESC) AS depth
    FROM ev k JOIN runtime r ON r.f = k.f AND r.corr = k.corr
    JOIN host h ON h.f = r.f AND h.pid = r.pid AND h.tid = r.tid AND h.start_ns <= r.start_ns AND h.end_ns >= r.start_ns
    WHERE k.cat = 'kernel' AND k.corr IS NOT NULL
)
SELECT f, k_start, corr,  -- the innermost ops (depth 1) say what ran; any enclosing op may state the group size
    max(name) FILTER (WHERE name <> 'record_param_comms' AND depth = 1) AS launcher,
    max(coll_name) FILTER (WHERE depth = 1) AS l_coll_name, max(in_nelems) FILTER (WHERE depth = 1) AS l_in_nelems,
    max(dtype) FILTER (WHERE depth = 1) AS l_dtype, max(pg_name) FILTER (WHERE depth = 1) AS l_pg_name,
    max(seq) FILTER (WHERE depth = 1) AS l_seq, max(group_size) AS l_group_size
FROM linked GROUP BY ALL
"""


def device_frames(con: duckdb.DuckDBPyConnection, rules: list[Rule]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """device_events (with each event's launching CPU op and its shapes: op_id, launch_op, input_dims, input_types,
    concrete_inputs: the event_ops table; its scope: scope_op, module, phase: the event_scopes table) and the raw
    collective rows (op decided, pg by name) for all GPU files."""
    events = con.sql(
        f"""WITH launchers AS ({_LAUNCHERS_SQL})
        SELECT k.f, row_number() OVER (PARTITION BY k.f  -- ties (a Send and a Recv kernel of one instant): stream
                                       ORDER BY k.start_ns, k.end_ns, k.name, k.stream, k.tid, k.corr) - 1 AS event_id,
               coalesce(k.stream, TRY_CAST(k.tid AS BIGINT)) AS stream, k.start_ns, k.end_ns, k.name, k.cat,
               k.coll_name, k.in_nelems, k.dtype, k.pg_name, k.seq, k.peer, l.launcher, l.l_coll_name,
               l.l_in_nelems, l.l_dtype, l.l_pg_name, l.l_seq, coalesce(k.group_size, l.l_group_size) AS group_size,
               r.launch_ns, k.corr, o.op_id, o.launch_op, o.input_dims, o.input_types, o.concrete_inputs,
               s.scope_op, s.module, s.phase
        FROM ev k LEFT JOIN launchers l ON l.f = k.f AND l.corr = k.corr AND l.k_start = k.start_ns
        LEFT JOIN ({_LAUNCHES_SQL}) r ON r.f = k.f AND r.corr = k.corr
        LEFT JOIN ({_OPS_SQL}) o ON o.f = k.f AND o.corr = k.corr
        LEFT JOIN ({_SCOPES_SQL}) s ON s.f = k.f AND s.corr = k.corr
        WHERE k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')"""
    ).pl()
    events = with_classes(events, "name", rules).with_columns(
        pl.when(pl.col("cat") == "gpu_memcpy").then(pl.lit("memcpy"))
        .when(pl.col("cat") == "gpu_memset").then(pl.lit("memset"))
        .otherwise(pl.col("category")).alias("category")
    )
    comm = events.filter(pl.col("category") == "comm")
    parsed = [parse_nccl_kernel(n) for n in comm["name"].to_list()]  # one call per comm kernel, not per event
    comm = comm.with_columns(
        pl.Series("kernel_op", [p[0] for p in parsed], dtype=pl.String()),
        pl.Series("name_dtype", [p[1] for p in parsed], dtype=pl.String()),
    )
    args_op = pl.col("coll_name").map_elements(canonical_op, return_dtype=pl.String())
    launcher_op = pl.coalesce(pl.col("l_coll_name"), pl.col("launcher")).map_elements(
        canonical_op, return_dtype=pl.String())
    name_op = pl.coalesce(pl.col("rule_op"), pl.col("kernel_op").replace({"Generic": None}))
    comm = comm.with_columns(
        pl.when(args_op.is_not_null()).then(pl.lit("pg-args"))
        .when(launcher_op.is_not_null() & pl.col("l_pg_name").is_not_null()).then(pl.lit("cpu-op"))
        .when(launcher_op.is_not_null()).then(pl.lit("op-only"))  # the CPU op names the op, not the group
        .otherwise(pl.lit("name-rule")).alias("evidence"),
        pl.coalesce(args_op, launcher_op, name_op, pl.lit("Unknown")).alias("op"),
        pl.coalesce("in_nelems", "l_in_nelems").alias("nelems"),
        pl.coalesce("dtype", "l_dtype").map_elements(canonical_dtype, return_dtype=pl.String()).alias("arg_dtype"),
        pl.coalesce("pg_name", "l_pg_name").alias("pg_name"),
        pl.coalesce("seq", "l_seq").alias("seq"),
    ).with_columns(pl.coalesce("arg_dtype", "name_dtype").alias("dtype"))
    comm = comm.with_columns(
        (pl.col("nelems") * pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
        .alias("bytes")
    )
    return events, comm


def device_steps(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, StepLinks, int]:
    """ProfilerStep#N on the device (step_windows.device_step_windows): each kernel / copy / memset belongs to the step
    whose CPU range on its process was open when the runtime call that launched it ran (correlation id, any thread:
    backward launches from autograd's thread); one without a recorded launch to the step of Kineto's own
    gpu_user_annotation ProfilerStep#N range that holds it, if any, else to its stream's previous event's step.
    Returns the windows, how they were found, and how many ProfilerStep ranges were left out (unnumbered)."""
    markers = con.sql(
        f"""SELECT f AS rank, TRY_CAST(regexp_extract(name, '{STEP}', 1) AS INTEGER) AS step, start_ns, end_ns
            FROM ev WHERE regexp_matches(name, '{STEP}') AND cat IN ('user_annotation', 'cpu_op')"""
    ).pl()
    unnumbered = markers["step"].null_count()
    markers = markers.drop_nulls("step")
    events = con.sql(
        f"""WITH launch AS ({_LAUNCHES_SQL}), device_step AS (
            SELECT f, TRY_CAST(regexp_extract(name, '{STEP}', 1) AS INTEGER) AS step, start_ns, end_ns FROM ev
            WHERE cat = 'gpu_user_annotation' AND regexp_matches(name, '{STEP}')
        )
        SELECT k.f AS rank, coalesce(k.stream, TRY_CAST(k.tid AS BIGINT)) AS stream, k.start_ns, k.end_ns,
               l.launch_ns, (SELECT max(d.step) FROM device_step d
                             WHERE d.f = k.f AND k.start_ns >= d.start_ns AND k.start_ns < d.end_ns) AS step
        FROM ev k LEFT JOIN launch l ON l.f = k.f AND l.corr = k.corr
        WHERE k.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')"""
    ).pl()
    windows, links = step_windows_of(events, markers)
    return windows.rename({"rank": "f"}), links, unnumbered
