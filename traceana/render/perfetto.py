"""A measured run as Trace Event Format JSON for ui.perfetto.dev and chrome://tracing.

One process per rank, named with its coordinates ("rank 5 · tp1 dp2 pp1"); a track of step windows on top, then the
host: one track per thread holding its tree of ranges (CPU ops, user and nn.Module ranges, NVTX; view host_ranges),
then each stream's compute work, then communication on one track per (dim, stream). Flow arrows link the members of
each collective instance in order of arrival, and each kernel to the host range that launched it (view
event_launchers: its CPU op, or for nsys the innermost NVTX range on the launching thread), from the launch call's
time inside it. The host trees are capped per rank, shallowest levels first (a budget over
all ranks, so a 1,024-rank export stays light); what the cap leaves out is counted. Above the ranks, a process
"critical path" holds the run's critical path (traceana/analyses/critical_path.py): one track per exported step
(consecutive steps' paths may overlap where ranks' windows do), one slice per path segment, named by its rank and
kind. Times are µs (ns precision) since the first exported event, on the run's aligned clock.

Colours: chrome://tracing honours ``cname`` (the nearest of its reserved colours to the plots' dim colours);
Perfetto deliberately ignores it and colours by name, so communication slices are named "<dim> <op>"
("TP AllReduce", the kernel's name in args) and every dim keeps one colour per op there too. The critical path is
black (grey over idle), as in the plots, a colour no dim has.

DuckDB builds every event's JSON text and writes the events to a file; Python only writes the envelope and the
few metadata events around them, then streams the file into the output (gzip for ``.gz``). Events on one track must
not overlap partially (viewers drop or mis-nest them): a track's events are spread over sub-tracks so that each
holds disjoint events, one set-based pass per sub-track.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from traceana.analyses.breakdown import COORDS, DIM_LANES
from traceana.errors import TraceanaError
from traceana.render import perfetto_host as host

# chrome://tracing reserved colours closest to colours.DIM_COLORS (tab:blue, purple, orange, green, red, brown) and
# to COMP's grey.
CNAME = {"TP": "rail_response", "CP": "detailed_memory_dump", "EP": "rail_idle", "DP": "rail_load",
         "PP": "rail_animation", "OTHER": "thread_state_unknown"}
COMPUTE_CNAME = "generic_work"
MAX_SUBTRACKS = 64  # beyond this many mutually overlapping events on one track, the rest share the last sub-track
STEP_TRACK = 0      # tid of the step windows; tracks of events follow from 1


@dataclass(frozen=True)
class Exported:
    """What was written: counts a user (and a test) can check against the store."""

    path: Path
    ranks: int
    slices: int        # device events
    step_slices: int   # step windows
    flows: int         # collective instances linked by arrows
    tracks: int
    path_slices: int   # critical path segments, all exported steps
    outside: int       # device events of the exported ranks outside every exported window: left out, counted
    host_slices: int   # host ranges (CPU ops, NVTX ...) on the exported ranks' thread tracks
    host_tracks: int
    host_capped: int   # host ranges in the exported windows that the per-rank cap left out, counted
    host_cap: int | None  # host ranges a rank keeps at most, shallowest first; None: the store has none (too old)
    launches: int      # arrows from a host range (CPU op, NVTX range) to a kernel it launched


def export(con: duckdb.DuckDBPyConnection, run_id: str, out: Path, steps: tuple[int, int] | None = None) -> Exported:
    """Write run ``run_id`` (its steps ``steps[0]..steps[1]`` only, when given) to ``out``."""
    _select(con, run_id, steps)
    _assign_tracks(con)
    host_cap = host.select(con, run_id)
    _critical_path(con, run_id)
    t0 = con.execute("SELECT least((SELECT min(start_ns) FROM x_events), (SELECT min(start_ns) FROM x_windows), "
                     "(SELECT min(start_ns) FROM x_host WHERE kept))").fetchall()[0][0]
    metadata = _metadata(con, run_id) + host.metadata(con) + _path_metadata(con)
    try:
        scratch = tempfile.TemporaryDirectory(dir=out.resolve().parent)
    except OSError as exc:  # a folder that cannot be written (read-only, /proc)
        raise TraceanaError(f"{out}: cannot write here ({exc.strerror})") from None
    with scratch as tmp:
        body = Path(tmp) / "events.jsonl"
        con.execute(f"COPY ({_events_sql(t0)}) TO '{_quoted(body)}' (FORMAT csv, HEADER false, QUOTE '', "
                    "ESCAPE '', DELIMITER '\t')")
        other = {"run_id": run_id, "exported_by": "traceana export --perfetto", "t0_ns": t0,
                 "steps": None if steps is None else list(steps)}
        opener = gzip.open if out.suffix == ".gz" else open
        try:
            with opener(out, "wb") as sink, body.open("rb") as events:
                sink.write(b'{"traceEvents":[\n' + ",\n".join(map(json.dumps, metadata)).encode())
                shutil.copyfileobj(events, sink, 1 << 20)
                sink.write(('\n],"displayTimeUnit":"ns","otherData":' + json.dumps(other) + "}\n").encode())
        except OSError as exc:
            raise TraceanaError(f"{out}: cannot write ({exc.strerror})") from None
    counts = con.execute("SELECT (SELECT count(DISTINCT rank) FROM x_windows), (SELECT count(*) FROM x_events), "
                         "(SELECT count(*) FROM x_windows), (SELECT count(*) FROM x_flows), "
                         "(SELECT count(DISTINCT (rank, tid)) FROM x_events), (SELECT count(*) FROM x_path), "
                         "(SELECT count(*) FROM device_events WHERE run_id = $r AND rank IN (SELECT rank FROM "
                         "x_windows)) - (SELECT count(*) FROM x_events), (SELECT count(*) FROM x_host WHERE kept), "
                         "(SELECT count(DISTINCT (rank, tid)) FROM x_host WHERE kept), "
                         "(SELECT count(*) FROM x_host WHERE NOT kept), $cap, (SELECT count(*) FROM x_launches)",
                         {"r": run_id, "cap": host_cap}).fetchall()[0]
    return Exported(out, *counts)


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def _select(con: duckdb.DuckDBPyConnection, run_id: str, steps: tuple[int, int] | None) -> None:
    """Temporary tables of what is exported: x_windows (step windows), x_events (device events overlapping them,
    with the dim of their collective), x_flows (collective members, numbered by arrival)."""
    lo, hi = steps if steps is not None else (None, None)
    con.execute("CREATE OR REPLACE TEMP TABLE x_windows AS SELECT rank, step, start_ns, end_ns, from_markers "
                "FROM step_windows WHERE run_id = $r AND ($lo IS NULL OR step BETWEEN $lo AND $hi)",
                {"r": run_id, "lo": lo, "hi": hi})
    if not con.execute("SELECT count(*) FROM x_windows").fetchall()[0][0]:
        known = [r[0] for r in con.execute("SELECT DISTINCT step FROM step_windows WHERE run_id = ? ORDER BY 1",
                                           [run_id]).fetchall()]
        if not known:
            raise TraceanaError(f"run {run_id!r} has no device events, so nothing to export")
        listing = ", ".join(map(str, known)) if len(known) <= 12 else f"{known[0]}..{known[-1]}"
        raise TraceanaError(f"--steps {lo}-{hi}: run {run_id!r} has no such steps (steps: {listing})")
    # A comm event's colour dim is the first token of its dim (TP-CP -> TP), as the breakdown charges it.
    lanes = ", ".join(f"'{d}'" for d in DIM_LANES)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE x_events AS
        WITH span AS (SELECT rank, min(start_ns) AS lo, max(end_ns) AS hi FROM x_windows GROUP BY rank),
        coll AS (SELECT rank, event_id, arg_min(struct_pack(op, dim, bytes, pg, instance), instance) AS c
                 FROM collectives WHERE run_id = $r GROUP BY ALL)
        SELECT e.rank, e.event_id, e.stream, e.start_ns, e.end_ns, e.name, e.category,
               c.c.op AS op, c.c.dim AS dim, c.c.bytes AS bytes, c.c.pg AS pg, c.c.instance AS instance,
               CASE WHEN e.category <> 'comm' THEN NULL
                    WHEN split_part(c.c.dim, '-', 1) IN ({lanes}) THEN split_part(c.c.dim, '-', 1)
                    ELSE 'OTHER' END AS lane,
               NULL::INTEGER AS sub, NULL::INTEGER AS tid
        FROM device_events e JOIN span s ON s.rank = e.rank AND e.end_ns > s.lo AND e.start_ns < s.hi
        LEFT JOIN coll c ON c.rank = e.rank AND c.event_id = e.event_id
        WHERE e.run_id = $r""", {"r": run_id})
    con.execute("""
        CREATE OR REPLACE TEMP TABLE x_flows AS
        SELECT instance, rank, event_id, start_ns,
               row_number() OVER (PARTITION BY instance ORDER BY start_ns, rank) AS arrival,
               count(*) OVER (PARTITION BY instance) AS members
        FROM x_events WHERE instance IS NOT NULL
        QUALIFY members > 1""")


def _critical_path(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """x_path: the critical path's segments of every exported step (one walk per step, not per event), with the
    process id of its track group: one past the last rank."""
    import polars as pl

    from traceana.analyses import critical_path as cp

    steps = [r[0] for r in con.execute("SELECT DISTINCT step FROM x_windows ORDER BY step").fetchall()]
    paths = [cp.of_step(con, run_id, step)[2].with_columns(pl.lit(step, pl.Int32).alias("step")) for step in steps]
    con.register("x_path_segments", pl.concat(paths).with_row_index("seq"))
    con.execute("CREATE OR REPLACE TEMP TABLE x_path AS SELECT *, (SELECT max(rank) + 1 FROM x_windows) AS pid "
                "FROM x_path_segments")
    con.unregister("x_path_segments")


def _path_metadata(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """The critical path's process (listed first) and its one track per step."""
    rows = con.execute("SELECT DISTINCT pid, step FROM x_path ORDER BY step").fetchall()
    if not rows:
        return []
    pid = rows[0][0]
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "critical path"}},
              {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}}]
    for _, step in rows:
        name = f"critical path · step {step}"
        events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": step, "args": {"name": name}},
                   {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": step, "args": {"sort_index": step}}]
    return events


def _assign_tracks(con: duckdb.DuckDBPyConnection) -> None:
    """Track of every event: (lane, stream) — lane NULL for compute — split into sub-tracks of disjoint events.

    Pass k keeps, among the events still without a sub-track, those that start after every earlier one of their
    track has ended (sorted by start, longest first); those are disjoint, the rest wait for pass k + 1."""
    for sub in range(MAX_SUBTRACKS):
        last = sub == MAX_SUBTRACKS - 1
        con.execute(f"""
            UPDATE x_events SET sub = {sub} FROM (
                SELECT rank, event_id, {'TRUE' if last else '''start_ns >= coalesce(max(end_ns) OVER (
                    PARTITION BY rank, lane, stream ORDER BY start_ns, end_ns DESC, event_id
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns)'''} AS free
                FROM x_events WHERE sub IS NULL) f
            WHERE f.free AND x_events.rank = f.rank AND x_events.event_id = f.event_id""")
        if not con.execute("SELECT count(*) FROM x_events WHERE sub IS NULL").fetchall()[0][0]:
            break
    order = " ".join(f"WHEN '{d}' THEN {i + 1}" for i, d in enumerate(DIM_LANES))
    con.execute(f"""
        UPDATE x_events SET tid = t.tid FROM (
            SELECT rank, lane, stream, sub, {STEP_TRACK} + dense_rank() OVER (
                PARTITION BY rank ORDER BY CASE lane {order} ELSE 0 END, stream NULLS FIRST, sub) AS tid
            FROM (SELECT DISTINCT rank, lane, stream, sub FROM x_events)) t
        WHERE x_events.rank = t.rank AND x_events.lane IS NOT DISTINCT FROM t.lane
          AND x_events.stream IS NOT DISTINCT FROM t.stream AND x_events.sub = t.sub""")


def _metadata(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """Process names (rank and the coordinates of dims larger than 1) and track names, with sort orders."""
    ranks = con.execute(f"SELECT rank, {', '.join(COORDS)} FROM ranks WHERE run_id = ? AND rank IN "
                        "(SELECT rank FROM x_windows) ORDER BY rank", [run_id]).fetchall()
    varying = [i for i, _ in enumerate(COORDS) if len({r[1 + i] for r in ranks}) > 1]
    events: list[dict] = []
    for rank, *coords in ranks:
        name = f"rank {rank}" + (" · " + " ".join(f"{COORDS[i]}{coords[i]}" for i in varying) if varying else "")
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": STEP_TRACK, "args": {"name": name}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": STEP_TRACK,
                    "args": {"sort_index": rank}},
                   {"ph": "M", "name": "thread_name", "pid": rank, "tid": STEP_TRACK, "args": {"name": "steps"}},
                   {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": STEP_TRACK,
                    "args": {"sort_index": host.STEPS_SORT_INDEX}}]
    tracks = con.execute("SELECT DISTINCT rank, tid, lane, stream, sub FROM x_events ORDER BY rank, tid").fetchall()
    for rank, tid, lane, stream, sub in tracks:
        name = (f"{lane} communication" if lane else "compute") + (f" · stream {stream}" if stream is not None else "")
        name += f" ({sub + 1})" if sub else ""
        events += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}},
                   {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}}]
    return events


def _events_sql(t0: int) -> str:
    """One line per event, each ',' + its JSON object (the metadata events before them carry no trailing comma)."""
    ts = f"round((start_ns - {t0}) / 1e3, 3)"
    dur = "round((end_ns - start_ns) / 1e3, 3)"
    cname = " ".join(f"WHEN '{d}' THEN '{c}'" for d, c in CNAME.items())
    return f"""
        SELECT ',' || json_object('ph', 'X', 'pid', rank, 'tid', {STEP_TRACK}, 'ts', {ts}, 'dur', {dur},
                                  'name', 'step ' || step, 'cat', 'step', 'cname', 'grey',
                                  'args', json_object('step', step, 'from_markers', from_markers))
        FROM x_windows
        UNION ALL
        SELECT ',' || json_object('ph', 'X', 'pid', rank, 'tid', tid, 'ts', {ts}, 'dur', {dur},
            'name', CASE WHEN lane IS NULL THEN name ELSE lane || ' ' || coalesce(op, 'comm') END,
            'cat', category, 'cname', CASE lane {cname} ELSE '{COMPUTE_CNAME}' END,
            'args', CASE WHEN lane IS NULL THEN json_object('stream', stream, 'event_id', event_id)
                         ELSE json_object('kernel', name, 'op', op, 'dim', dim, 'bytes', bytes, 'pg', pg,
                                          'instance', instance, 'stream', stream, 'event_id', event_id) END)
        FROM x_events
        UNION ALL
        SELECT ',' || json_object('ph', 'X', 'pid', pid, 'tid', step, 'ts', {ts}, 'dur', {dur},
            'name', 'rank ' || rank || ' ' || CASE kind WHEN 'comm' THEN coalesce(dim, 'comm') ELSE kind END,
            'cat', 'critical_path', 'cname', CASE kind WHEN 'idle' THEN 'grey' ELSE 'black' END,
            'args', json_object('rank', rank, 'stage', stage, 'kind', kind, 'dim', dim, 'name', name, 'step', step,
                                'segment', seq))
        FROM x_path
        UNION ALL
        SELECT ',' || json_object('ph', CASE WHEN f.arrival = 1 THEN 's' WHEN f.arrival = f.members THEN 'f'
                                             ELSE 't' END,
                                  'bp', 'e', 'id', f.instance, 'pid', f.rank, 'tid', e.tid,
                                  'ts', round((f.start_ns - {t0}) / 1e3, 3), 'cat', 'collective',
                                  'name', 'collective')
        FROM x_flows f JOIN x_events e USING (rank, event_id)
        UNION ALL
        {host.events_sql(t0)}"""
