-- window_events: each device event of work or communication (compute, memcpy, memset, comm; not empty) in each step
-- window it overlaps, clipped to the window: what step_segments sweeps and event_time shares out. The window is found
-- through window_buckets (an equality join on a bucket of the rank's time); an event is bucketed only within its
-- rank's windows (an event reaching far past them lists no more buckets than they hold), and meets each window it
-- overlaps once, in the bucket of the overlap's first instant.
-- Columns: run_id, rank, step, event_id (BIGINT), category (VARCHAR, as device_events), start_ns, end_ns (BIGINT
--   ns: the part of the event inside the window).
CREATE OR REPLACE VIEW window_events AS
WITH work AS (  -- each event once per bucket it spans within its rank's windows
    SELECT e.run_id, e.rank, e.event_id, e.category, e.start_ns, e.end_ns, b.width,
           unnest(range(greatest(e.start_ns, b.lo) // b.width, (least(e.end_ns, b.hi) - 1) // b.width + 1)) AS bucket
    FROM device_events e
    JOIN (SELECT run_id, rank, any_value(width) AS width, min(start_ns) AS lo, max(end_ns) AS hi
          FROM window_buckets GROUP BY ALL) b ON b.run_id = e.run_id AND b.rank = e.rank
    WHERE e.category IN ('compute', 'memcpy', 'memset', 'comm') AND e.end_ns > e.start_ns
)
SELECT w.run_id, w.rank, w.step, e.event_id, e.category,
       greatest(e.start_ns, w.start_ns) AS start_ns, least(e.end_ns, w.end_ns) AS end_ns
FROM work e
JOIN window_buckets w ON w.run_id = e.run_id AND w.rank = e.rank AND w.bucket = e.bucket
                     AND e.start_ns < w.end_ns AND e.end_ns > w.start_ns
                     AND e.bucket = greatest(e.start_ns, w.start_ns) // e.width;  -- each pair once
