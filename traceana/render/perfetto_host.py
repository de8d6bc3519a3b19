"""The host side of a Perfetto export (perfetto.py): each rank's host threads above its device tracks, and an arrow
from the host range that launched each kernel (its CPU op; for nsys, the innermost NVTX range on the launching
thread) to the kernel, so a slow kernel leads back to its op and layer.

Each thread gets two tracks: its CPU ops, and above them its other ranges (nn.Module and user ranges; NVTX for nsys),
from view host_ranges. Perfetto nests the slices of a track by time and needs them to nest: ranges of one thread
mostly do, but not always (gloo's recv range outlives the c10d::recv_ op it starts in; an async op ends after its
parent), so a range that ends after the range around it moves to a second track of its kind, and so on. The arrows
(view event_launchers) start at the launch call inside the op: on the ops' track nothing deeper is open there, as the
op is the innermost at launch (a user range may open inside it, which is why the ranges have their own track); an
NVTX range is the innermost of its track at launch by construction.

A rank keeps at most ``cap`` ranges, the shallowest first (whole top levels of each thread's tree, then the earliest
of the next level), the cap shared out of a budget over the ranks; what it leaves out is counted, and a kernel whose
range was left out gets no arrow. A range is found again by what identifies it in host_ranges: rank, thread, start
and depth (an NVTX range has no op id).
"""

from __future__ import annotations

import duckdb

HOST_TRACK = 1 << 20  # tids of the host tracks from here: above the device's tracks (sort index below theirs)
STEPS_SORT_INDEX = -2 * HOST_TRACK  # the step windows' track stays on top
HOST_BUDGET, HOST_FLOOR = 400_000, 2_000  # host ranges in a file, and the fewest a rank keeps however many ranks
MAX_NEST_TRACKS = 16  # tracks of one kind per thread; the last takes whatever still does not nest


def select(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """x_host: the host ranges of the exported ranks (x_windows) that overlap their windows, the shallowest ``cap``
    of each rank ``kept``, each with its track (tid); x_launches: the arrows from a kept range to the exported
    events (x_events) it launched. Returns the cap, or None for a store ingested before annotations had threads,
    which has no host ranges (both tables empty)."""
    ranks = con.execute("SELECT count(DISTINCT rank) FROM x_windows").fetchall()[0][0]
    cap = max(HOST_FLOOR, HOST_BUDGET // max(ranks, 1))
    span = "(SELECT rank, min(start_ns) AS lo, max(end_ns) AS hi FROM x_windows GROUP BY rank)"
    try:
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE x_host AS
            SELECT h.*, row_number() OVER () AS hid, h.kind = 'cpu_op' AS ops, 0 AS nest, NULL::BIGINT AS tid,
                   row_number() OVER (PARTITION BY h.rank ORDER BY h.depth, h.start_ns, h.thread, h.end_ns DESC,
                                       h.op_id NULLS LAST, h.name) <= $cap AS kept
            FROM host_ranges h JOIN {span} s ON s.rank = h.rank AND h.end_ns > s.lo AND h.start_ns < s.hi
            WHERE h.run_id = $r""", {"r": run_id, "cap": cap})
    except duckdb.CatalogException:  # annotations without a thread column: no views host_ranges, event_launchers
        con.execute("CREATE OR REPLACE TEMP TABLE x_host AS SELECT NULL::INTEGER AS rank, NULL::BIGINT AS thread, "
                    "NULL::BIGINT AS start_ns, NULL::BIGINT AS end_ns, NULL AS name, NULL AS kind, NULL AS domain, "
                    "NULL::BIGINT AS op_id, NULL::INTEGER AS depth, NULL::BIGINT AS hid, FALSE AS ops, 0 AS nest, "
                    "NULL::BIGINT AS tid, FALSE AS kept WHERE FALSE")
        con.execute("CREATE OR REPLACE TEMP TABLE x_launches AS SELECT NULL::BIGINT AS id, NULL::INTEGER AS rank, "
                    "NULL::BIGINT AS launch_ns, NULL::BIGINT AS host_tid, NULL::BIGINT AS tid, "
                    "NULL::BIGINT AS start_ns WHERE FALSE")
        return None
    _nest(con)
    con.execute(f"""
        UPDATE x_host SET tid = t.tid FROM (
            SELECT hid, {HOST_TRACK} - 1 + dense_rank() OVER (PARTITION BY rank ORDER BY thread, ops, nest) AS tid
            FROM x_host WHERE kept) t
        WHERE x_host.hid = t.hid""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE x_launches AS
        SELECT row_number() OVER (ORDER BY l.rank, l.event_id) AS id, l.rank, l.launch_ns, h.tid AS host_tid, e.tid,
               e.start_ns
        FROM event_launchers l JOIN x_events e ON e.rank = l.rank AND e.event_id = l.event_id
        JOIN x_host h ON h.rank = l.rank AND h.thread = l.thread AND h.start_ns = l.op_start_ns AND h.depth = l.depth
        WHERE l.run_id = $r AND h.kept""", {"r": run_id})
    return cap


def _nest(con: duckdb.DuckDBPyConnection) -> None:
    """Move each kept range that ends after the range around it (on its track: the last to open one level up) to
    the next track of its kind, until every track's ranges nest. A move can strand a range that was inside the
    moved one, so each track is checked again until nothing moves."""
    for nest in range(MAX_NEST_TRACKS - 1):
        while con.execute(f"""
            UPDATE x_host SET nest = {nest + 1} WHERE hid IN (
                WITH r AS (SELECT * FROM x_host WHERE kept AND nest = {nest}),
                marks AS (  -- as host_ranges' depth: ends first, then starts (the longer first), then empty ends
                    SELECT rank, thread, ops, unnest([start_ns, end_ns]) AS t,
                           unnest([1, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END]) AS k,
                           unnest([-end_ns, 0]) AS tie, unnest([1, -1]) AS delta, unnest([hid, NULL]) AS hid
                    FROM r),
                opened AS (
                    SELECT r.*, d.level FROM r JOIN (
                        SELECT hid, sum(delta) OVER (PARTITION BY rank, thread, ops ORDER BY t, k, tie
                                                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS level
                        FROM marks) d USING (hid))
                SELECT c.hid FROM opened c
                ASOF JOIN opened p ON p.rank = c.rank AND p.thread = c.thread AND p.ops = c.ops
                                  AND p.level = c.level - 1 AND p.start_ns <= c.start_ns
                WHERE p.end_ns < c.end_ns)""").fetchall()[0][0]:
            pass
        if not con.execute(f"SELECT count(*) FROM x_host WHERE kept AND nest = {nest + 1}").fetchall()[0][0]:
            return


def metadata(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """The host tracks' names ("CPU ops · thread 8132", "NVTX · thread 8132", "ranges · thread 8132" for nn.Module
    and user ranges; a second track of a kind "(2)"), between the steps' track and the device's."""
    rows = con.execute("SELECT rank, tid, thread, nest, bool_or(ops), bool_and(kind = 'nvtx') FROM x_host "
                       "WHERE kept GROUP BY ALL ORDER BY rank, tid").fetchall()
    events: list[dict] = []
    for rank, tid, thread, nest, ops, nvtx in rows:
        what = "CPU ops" if ops else "NVTX" if nvtx else "ranges"
        events += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                    "args": {"name": f"{what} · thread {thread}" + (f" ({nest + 1})" if nest else "")}},
                   {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                    "args": {"sort_index": tid - 2 * HOST_TRACK + 1}}]
    return events


def events_sql(t0: int) -> str:
    """The host slices and the launch arrows, one JSON object a line as perfetto._events_sql writes them."""
    return f"""
        SELECT ',' || json_object('ph', 'X', 'pid', rank, 'tid', tid, 'ts', round((start_ns - {t0}) / 1e3, 3),
                                  'dur', round((end_ns - start_ns) / 1e3, 3), 'name', name, 'cat', kind,
                                  'args', json_object('thread', thread, 'depth', depth, 'op_id', op_id,
                                                      'domain', domain))
        FROM x_host WHERE kept
        UNION ALL
        SELECT ',' || json_object('ph', p.ph, 'bp', 'e', 'id', l.id, 'pid', l.rank, 'tid', p.tid, 'cat', 'launch',
                                  'name', 'launch', 'ts', round((p.t - {t0}) / 1e3, 3))
        FROM x_launches l, LATERAL (VALUES ('s', l.host_tid, l.launch_ns), ('f', l.tid, l.start_ns)) p(ph, tid, t)"""
