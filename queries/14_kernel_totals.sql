-- kernel_totals: device time per kernel (short name, kernel_names) on each rank, over the events that start in one
-- of the rank's step windows, beside the rank's COMP (the union of its compute / memcpy / memset time) over the same
-- windows, so shares of COMP can be taken per rank, stage or run.
-- Columns: run_id, rank, pp (stage, NULL without a layout), short_name, category (compute / memcpy / memset / comm /
--   sync / other), variants (INTEGER: distinct full names merged), calls (BIGINT), total_ns, max_ns (BIGINT ns:
--   summed and longest event durations), steps (INTEGER: the rank's step windows), rank_COMP_ns (BIGINT ns: the
--   rank's COMP summed over those windows; kernels on concurrent streams can add up to more).
CREATE OR REPLACE VIEW kernel_totals AS
WITH bucketed AS (  -- each event with the bucket of its start (window_buckets), a column to join on
    SELECT e.*, e.start_ns // b.width AS bucket
    FROM device_events e
    JOIN (SELECT DISTINCT run_id, rank, width FROM window_buckets) b ON b.run_id = e.run_id AND b.rank = e.rank
),
events AS (
    SELECT e.run_id, e.rank, n.short_name, e.category, e.name, e.end_ns - e.start_ns AS ns
    FROM bucketed e
    JOIN window_buckets w ON w.run_id = e.run_id AND w.rank = e.rank AND w.bucket = e.bucket
                         AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns
    JOIN kernel_names n ON n.run_id = e.run_id AND n.name = e.name
),
comp AS (
    SELECT run_id, rank, count(*)::INTEGER AS steps, sum(COMP_ns)::BIGINT AS rank_COMP_ns
    FROM rank_step_breakdown
    GROUP BY run_id, rank
)
SELECT v.run_id, v.rank, k.pp, v.short_name, v.category, count(DISTINCT v.name)::INTEGER AS variants,
       count(*) AS calls, sum(v.ns)::BIGINT AS total_ns, max(v.ns) AS max_ns, c.steps, c.rank_COMP_ns
FROM events v
JOIN comp c USING (run_id, rank)
LEFT JOIN ranks k ON k.run_id = v.run_id AND k.rank = v.rank
GROUP BY v.run_id, v.rank, k.pp, v.short_name, v.category, c.steps, c.rank_COMP_ns;
