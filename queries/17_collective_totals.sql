-- collective_totals: each rank's communication per op and dim over the events that start in its step windows
-- (the collectives rows joined to their device events), beside the number of those windows, so that runs of
-- different sizes and lengths compare per rank and step.
-- Columns: run_id, rank, op, dim, calls (BIGINT), bytes (BIGINT: summed collectives.bytes, NULL when none known),
--   total_ns (BIGINT ns: summed kernel / task durations, waiting included), steps (INTEGER: the rank's windows).
CREATE OR REPLACE VIEW collective_totals AS
WITH windows AS (
    SELECT run_id, rank, count(*)::INTEGER AS steps FROM step_windows GROUP BY run_id, rank
)
SELECT c.run_id, c.rank, c.op, c.dim, count(*) AS calls, sum(c.bytes)::BIGINT AS bytes,
       sum(e.end_ns - e.start_ns)::BIGINT AS total_ns, any_value(n.steps) AS steps
FROM collectives c
JOIN device_events e ON e.run_id = c.run_id AND e.rank = c.rank AND e.event_id = c.event_id
JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns
JOIN windows n ON n.run_id = c.run_id AND n.rank = c.rank
GROUP BY c.run_id, c.rank, c.op, c.dim;
