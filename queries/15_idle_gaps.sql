-- idle_gaps: why the device was idle. Each maximal stretch of a rank's step where nothing counted as work or
-- communication runs (the IDLE of rank_step_breakdown, piece by piece) with its likely cause:
--   'step_boundary'  the gap touches the step window's start or end (data loading, optimizer host work, the
--                    profiler's step marker before the first kernel or after the last);
--   'sync_wait'      a sync-category device event (Ascend EVENT_WAIT / EVENT_RECORD, stream or device
--                    synchronization) overlaps the gap;
--   'queued'         the event that ends the gap was launched before the gap began: the work was queued and waited
--                    on a dependency (an event on another stream, a host synchronization), or, for gaps of a few µs,
--                    on the device's own switch from one kernel to the next;
--   'host_launch'    the event that ends the gap was launched after the gap began: the device ran dry waiting for
--                    the host to launch it (host-bound);
--   'unknown'        none of the above can be told: the event that ends the gap has no launch record (CPU-only
--                    runs, formats without runtime correlation).
-- Columns: run_id, rank, step, start_ns, end_ns (BIGINT ns, end exclusive), cause (VARCHAR), next_event_id (BIGINT:
--   the event that ends the gap; NULL at the step's end), next_launch_ns (BIGINT ns: its launch, NULL when unknown).
CREATE OR REPLACE VIEW idle_gaps AS
WITH idle AS (
    SELECT run_id, rank, step, start_ns, end_ns,
           CASE WHEN start_ns = lag(end_ns) OVER (PARTITION BY run_id, rank, step ORDER BY start_ns) THEN 0 ELSE 1
           END AS new_gap
    FROM step_segments
    WHERE NOT (busy OR tp OR cp OR ep OR dp OR pp OR other)
),
gaps AS (
    SELECT run_id, rank, step, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM (SELECT *, sum(new_gap) OVER (PARTITION BY run_id, rank, step ORDER BY start_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS gap FROM idle)
    GROUP BY run_id, rank, step, gap
),
starts AS (  -- a gap ends where work starts: the events starting at each instant (the lowest id for a tie)
    SELECT run_id, rank, start_ns, min(event_id) AS event_id, arg_min(launch_ns, event_id) AS launch_ns
    FROM device_events
    WHERE category IN ('compute', 'memcpy', 'memset', 'comm') AND end_ns > start_ns
    GROUP BY run_id, rank, start_ns
),
next_event AS (
    SELECT g.*, a.event_id AS next_event_id, a.launch_ns AS next_launch_ns
    FROM gaps g
    LEFT JOIN starts a ON a.run_id = g.run_id AND a.rank = g.rank AND a.start_ns = g.end_ns
)
SELECT n.run_id, n.rank, n.step, n.start_ns, n.end_ns,
       CASE WHEN n.start_ns = w.start_ns OR n.end_ns = w.end_ns THEN 'step_boundary'
            WHEN EXISTS (SELECT 1 FROM device_events s
                         WHERE s.run_id = n.run_id AND s.rank = n.rank AND s.category = 'sync'
                           AND s.start_ns < n.end_ns AND s.end_ns > n.start_ns) THEN 'sync_wait'
            WHEN n.next_launch_ns IS NULL THEN 'unknown'
            WHEN n.next_launch_ns > n.start_ns THEN 'host_launch'
            ELSE 'queued' END AS cause,
       CASE WHEN n.end_ns < w.end_ns THEN n.next_event_id END AS next_event_id,
       CASE WHEN n.end_ns < w.end_ns THEN n.next_launch_ns END AS next_launch_ns
FROM next_event n
JOIN step_windows w USING (run_id, rank, step);
