-- step_segments: each rank's step window cut at every device-event boundary (a sweep over sorted start/end points),
-- with what was running in each piece. The breakdown, the per-class unions and the timeline all read it.
-- Columns: run_id, rank, step, start_ns, end_ns (BIGINT ns, end exclusive; pieces never overlap and tile the window),
--   busy (BOOLEAN: some compute / memcpy / memset event runs),
--   tp, cp, ep, dp, pp, other (BOOLEAN: a collective of that dim runs; a comm event is charged by the first token of
--   its dim — TP-CP -> tp, DP-EP -> dp, EP-TP -> ep — and to other when its dim is UNKNOWN or it has no collectives row).
-- Events of category sync / other are neither work nor communication: their time is IDLE.
-- The sweep keeps one running sum (each window aggregate costs about as much as the sort): the open events of
-- every class packed into one number, 7 bits per dim (TP lowest, OTHER at bit 35) and busy events from bit 42.
-- The sum is a DOUBLE and exact: every partial sum is a difference of two packed counts below 2^53. Limits: fewer
-- than 128 collectives of one dim and 2048 compute events running at once on one rank.
CREATE OR REPLACE VIEW step_segments AS
WITH clipped AS (
    SELECT e.run_id, e.rank, e.step, e.start_ns, e.end_ns,
           (1::BIGINT << CASE WHEN e.category <> 'comm' THEN 42
                              ELSE CASE split_part(c.dim, '-', 1) WHEN 'TP' THEN 0 WHEN 'CP' THEN 7 WHEN 'EP' THEN 14
                                        WHEN 'DP' THEN 21 WHEN 'PP' THEN 28 ELSE 35 END END)::DOUBLE AS unit
    FROM window_events e
    LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
),
points AS (  -- an event adds its unit where it starts and removes it where it ends; the window edges add nothing
             -- but make the idle ends of the window pieces too
    SELECT run_id, rank, step, unnest([start_ns, end_ns]) AS t, unnest([unit, -unit]) AS delta FROM clipped
    UNION ALL
    SELECT run_id, rank, step, unnest([start_ns, end_ns]), 0 FROM step_windows
),
sweep AS (  -- points sharing a time make zero-length pieces, all but the last, which carries the full count
    SELECT run_id, rank, step, t AS start_ns, lead(t) OVER w AS end_ns, (sum(delta) OVER w)::BIGINT AS open
    FROM points
    WINDOW w AS (PARTITION BY run_id, rank, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT run_id, rank, step, start_ns, end_ns, open >> 42 > 0 AS busy,
       open & 127 > 0 AS tp, (open >> 7) & 127 > 0 AS cp, (open >> 14) & 127 > 0 AS ep,
       (open >> 21) & 127 > 0 AS dp, (open >> 28) & 127 > 0 AS pp, (open >> 35) & 127 > 0 AS other
FROM sweep
WHERE end_ns > start_ns;
