-- step_segments: each rank's step window cut at every device-event boundary (a sweep over sorted start/end points),
-- with what was running in each piece. The breakdown, the per-class unions and the timeline all read it.
-- Columns: run_id, rank, step, start_ns, end_ns (BIGINT ns, end exclusive; pieces never overlap and tile the window),
--   busy (BOOLEAN: some compute / memcpy / memset event runs),
--   tp, cp, ep, dp, pp, other (BOOLEAN: a collective of that dim runs; a comm event is charged by the first token of
--   its dim — TP-CP -> tp, DP-EP -> dp, EP-TP -> ep — and to other when its dim is UNKNOWN or it has no collectives row).
-- Events of category sync / other are neither work nor communication: their time is IDLE.
-- The sweep keeps two running sums, not seven (each window aggregate costs as much as the sort): open busy events,
-- and open collectives per dim packed 8 bits a dim (TP lowest, OTHER at bit 40). The sums are DOUBLE, exact here:
-- every partial sum is a difference of two packed counts below 2^48. Limit: fewer than 256 collectives of one dim
-- running at once on one rank.
CREATE OR REPLACE VIEW step_segments AS
WITH clipped AS (
    SELECT w.run_id, w.rank, w.step,
           greatest(e.start_ns, w.start_ns) AS start_ns, least(e.end_ns, w.end_ns) AS end_ns,
           (e.category <> 'comm')::INT::DOUBLE AS busy_unit,
           CASE WHEN e.category <> 'comm' THEN 0
                ELSE 1::BIGINT << CASE split_part(c.dim, '-', 1) WHEN 'TP' THEN 0 WHEN 'CP' THEN 8 WHEN 'EP' THEN 16
                                WHEN 'DP' THEN 24 WHEN 'PP' THEN 32 ELSE 40 END END::DOUBLE AS dim_unit
    FROM device_events e
    JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank
                       AND e.start_ns < w.end_ns AND e.end_ns > w.start_ns
    LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
    WHERE e.category IN ('compute', 'memcpy', 'memset', 'comm') AND e.end_ns > e.start_ns
),
points AS (  -- an event adds its units where it starts and removes them where it ends; the window edges add
             -- nothing but make the idle ends of the window pieces too
    SELECT run_id, rank, step, unnest([start_ns, end_ns]) AS t, unnest([busy_unit, -busy_unit]) AS d_busy,
           unnest([dim_unit, -dim_unit]) AS d_dims
    FROM clipped
    UNION ALL
    SELECT run_id, rank, step, unnest([start_ns, end_ns]), 0, 0 FROM step_windows
),
sweep AS (  -- points sharing a time make zero-length pieces, all but the last, which carries the full counts
    SELECT run_id, rank, step, t AS start_ns, lead(t) OVER w AS end_ns,
           sum(d_busy) OVER w AS n_busy, (sum(d_dims) OVER w)::BIGINT AS n_dims
    FROM points
    WINDOW w AS (PARTITION BY run_id, rank, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run_id, rank, step, start_ns, end_ns, n_busy > 0 AS busy,
       n_dims & 255 > 0 AS tp, (n_dims >> 8) & 255 > 0 AS cp, (n_dims >> 16) & 255 > 0 AS ep,
       (n_dims >> 24) & 255 > 0 AS dp, (n_dims >> 32) & 255 > 0 AS pp, (n_dims >> 40) & 255 > 0 AS other
FROM sweep
WHERE end_ns > start_ns;
