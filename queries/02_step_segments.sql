-- step_segments: each rank's step window cut at every device-event boundary (a sweep over sorted start/end points),
-- with what was running in each piece. The breakdown, the per-class unions and the timeline all read it.
-- Columns: run_id, rank, step, start_ns, end_ns (BIGINT ns, end exclusive, pieces never overlap and tile the window),
--   busy (BOOLEAN: some compute / memcpy / memset event runs),
--   tp, cp, ep, dp, pp, other (BOOLEAN: a collective of that dim runs; a comm event is charged by the first token of
--   its dim — TP-CP -> tp, DP-EP -> dp, EP-TP -> ep — and to other when its dim is UNKNOWN or it has no collectives row).
-- Events of category sync / other are neither work nor communication: their time is IDLE.
CREATE OR REPLACE VIEW step_segments AS
WITH clipped AS (
    SELECT w.run_id, w.rank, w.step,
           greatest(e.start_ns, w.start_ns) AS start_ns, least(e.end_ns, w.end_ns) AS end_ns,
           CASE WHEN e.category = 'comm' THEN
                CASE split_part(c.dim, '-', 1) WHEN 'TP' THEN 'tp' WHEN 'CP' THEN 'cp' WHEN 'EP' THEN 'ep'
                     WHEN 'DP' THEN 'dp' WHEN 'PP' THEN 'pp' ELSE 'other' END
                ELSE 'busy' END AS class
    FROM device_events e
    JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank
                       AND e.start_ns < w.end_ns AND e.end_ns > w.start_ns
    LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
    WHERE e.category IN ('compute', 'memcpy', 'memset', 'comm') AND e.end_ns > e.start_ns
),
points AS (  -- +1 where an event starts, -1 where it ends, 0 at the window edges so idle ends are covered too
    SELECT run_id, rank, step, start_ns AS t, class, 1 AS delta FROM clipped
    UNION ALL SELECT run_id, rank, step, end_ns, class, -1 FROM clipped
    UNION ALL SELECT run_id, rank, step, start_ns, 'busy', 0 FROM step_windows
    UNION ALL SELECT run_id, rank, step, end_ns, 'busy', 0 FROM step_windows
),
sweep AS (  -- running count of open events per class; rows sharing a time get a zero-length piece but the last
    SELECT run_id, rank, step, t AS start_ns,
           lead(t) OVER w AS end_ns,
           sum(delta) FILTER (WHERE class = 'busy') OVER w AS n_busy,
           sum(delta) FILTER (WHERE class = 'tp') OVER w AS n_tp,
           sum(delta) FILTER (WHERE class = 'cp') OVER w AS n_cp,
           sum(delta) FILTER (WHERE class = 'ep') OVER w AS n_ep,
           sum(delta) FILTER (WHERE class = 'dp') OVER w AS n_dp,
           sum(delta) FILTER (WHERE class = 'pp') OVER w AS n_pp,
           sum(delta) FILTER (WHERE class = 'other') OVER w AS n_other
    FROM points
    WINDOW w AS (PARTITION BY run_id, rank, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run_id, rank, step, start_ns, end_ns,
       coalesce(n_busy, 0) > 0 AS busy,
       coalesce(n_tp, 0) > 0 AS tp, coalesce(n_cp, 0) > 0 AS cp, coalesce(n_ep, 0) > 0 AS ep,
       coalesce(n_dp, 0) > 0 AS dp, coalesce(n_pp, 0) > 0 AS pp, coalesce(n_other, 0) > 0 AS other
FROM sweep
WHERE end_ns > start_ns;
