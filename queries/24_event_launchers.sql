-- event_launchers: each device event and the host range that launched it, where the store links the two, with
-- where on the host the launch was. Kineto: the CPU op whose External id the kernel carries (event_ops.op_id); the
-- launch is its runtime call's start (device_events.launch_ns), which lies inside the op, or the op's start where the
-- call was not recorded. An event without such an op (nsys) whose runtime call is recorded with its thread
-- (device_events.launch_thread) is linked to the innermost range open on that thread at launch_ns: of those whose
-- start_ns <= launch_ns <= end_ns, the latest to start (at a tie, the shorter). An export draws an arrow from there
-- to the event, so a slow kernel leads back to its op or NVTX range and its layer.
-- The innermost range comes from a sweep, not a range join (which would pair each launch with every range of its
-- thread): ranges open (+1) at their start and close (-1) at their end; a launch inside d ranges lies in the last
-- range to open at level d before it (an ASOF join). Ties: opens (the longer first), then launches, then closes, as
-- a range's interval is closed. Ranges of one thread nest; where one outlives the range around it, a launch after
-- the inner one's end may find no range and get no row.
-- A range is identified, as in host_ranges, by (run_id, rank, thread, op_start_ns, depth): two ranges of one thread
-- that start together differ in depth.
-- Columns: run_id, rank, event_id (BIGINT: the device event), op_id (BIGINT: the range's, as host_ranges: a Kineto
--   CPU op's External id, NULL for an NVTX range), thread (BIGINT: the range's), op (VARCHAR: its name),
--   op_start_ns, op_end_ns, launch_ns (BIGINT ns; op_start_ns <= launch_ns <= op_end_ns), depth (INTEGER: the
--   range's, as host_ranges).
CREATE OR REPLACE VIEW event_launchers AS
WITH launched AS (  -- events not linked through event_ops whose launch call's thread is known
    SELECT e.run_id, e.rank, e.event_id, e.launch_thread AS thread, e.launch_ns
    FROM device_events e
    ANTI JOIN event_ops o ON o.run_id = e.run_id AND o.rank = e.rank AND o.event_id = e.event_id
    WHERE e.launch_thread IS NOT NULL AND e.launch_ns IS NOT NULL
),
ranges AS (  -- the host ranges of the threads that launched them
    SELECT h.*, row_number() OVER () AS rid
    FROM host_ranges h SEMI JOIN launched l ON l.run_id = h.run_id AND l.rank = h.rank AND l.thread = h.thread
),
marks AS (
    SELECT run_id, rank, thread, start_ns AS t, 0 AS k, -end_ns AS tie, 1 AS delta, rid AS id FROM ranges
    UNION ALL SELECT run_id, rank, thread, end_ns, 2, 0, -1, NULL FROM ranges
    UNION ALL SELECT run_id, rank, thread, launch_ns, 1, 0, 0, event_id FROM launched
),
levels AS (
    SELECT *, sum(delta) OVER (PARTITION BY run_id, rank, thread ORDER BY t, k, tie ROWS UNBOUNDED PRECEDING) AS level
    FROM marks
),
opens AS (SELECT run_id, rank, thread, t, level, id AS rid FROM levels WHERE k = 0),
inside AS (SELECT run_id, rank, thread, t, level, id AS event_id FROM levels WHERE k = 1 AND level > 0)
SELECT o.run_id, o.rank, o.event_id, o.op_id, h.thread, h.name AS op, h.start_ns AS op_start_ns, h.end_ns AS op_end_ns,
       least(greatest(coalesce(e.launch_ns, h.start_ns), h.start_ns), h.end_ns) AS launch_ns, h.depth
FROM event_ops o
JOIN device_events e ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.event_id
JOIN host_ranges h ON h.run_id = o.run_id AND h.rank = o.rank AND h.op_id = o.op_id
UNION ALL
SELECT p.run_id, p.rank, p.event_id, r.op_id, r.thread, r.name, r.start_ns, r.end_ns, p.t, r.depth
FROM inside p
ASOF JOIN opens o ON o.run_id = p.run_id AND o.rank = p.rank AND o.thread = p.thread AND o.level = p.level
                 AND o.t <= p.t
JOIN ranges r ON r.rid = o.rid
WHERE r.end_ns >= p.t;
