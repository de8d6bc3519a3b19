-- stragglers: per rank, how its own work and its lateness compare with its pipeline stage (the ranks that should do
-- the same work). The `stragglers` command applies the user's threshold to COMP_excess_pct.
-- Columns: run_id, rank, pp, steps (INTEGER), COMP_ns (DOUBLE ns: its typical step's COMP, rank_breakdown),
--   stage_median_COMP_ns (DOUBLE ns: median of COMP_ns over the stage's ranks), COMP_excess_pct (DOUBLE %:
--   100·(COMP / stage median − 1)), straggler_stage (BOOLEAN: the rank is in the stage with the largest mean COMP,
--   ties to the lower stage), last_arrivals (INTEGER: collective instances with ≥ 2 traced ranks where it arrived
--   last), caused_wait_ns (BIGINT ns: the other ranks' total wait in those instances).
CREATE OR REPLACE VIEW stragglers AS
WITH typical AS (
    SELECT run_id, rank, pp, steps, COMP_ns,
           median(COMP_ns) OVER (PARTITION BY run_id, pp) AS stage_median_COMP_ns,
           avg(COMP_ns) OVER (PARTITION BY run_id, pp) AS stage_mean_COMP_ns
    FROM rank_breakdown
    WHERE step IS NULL
),
top_stage AS (
    SELECT DISTINCT run_id, first(pp ORDER BY stage_mean_COMP_ns DESC, pp NULLS FIRST) OVER (PARTITION BY run_id) AS pp
    FROM typical
),
late AS (
    SELECT run_id, last_rank AS rank, count(*)::INTEGER AS last_arrivals, sum(total_wait_ns)::BIGINT AS caused_wait_ns
    FROM collective_instances
    WHERE ranks_seen > 1
    GROUP BY run_id, last_rank
)
SELECT t.run_id, t.rank, t.pp, t.steps, t.COMP_ns, t.stage_median_COMP_ns,
       100 * t.COMP_ns / nullif(t.stage_median_COMP_ns, 0) - 100 AS COMP_excess_pct,
       s.run_id IS NOT NULL AS straggler_stage,
       coalesce(l.last_arrivals, 0) AS last_arrivals, coalesce(l.caused_wait_ns, 0) AS caused_wait_ns
FROM typical t
LEFT JOIN top_stage s ON s.run_id = t.run_id AND s.pp IS NOT DISTINCT FROM t.pp
LEFT JOIN late l ON l.run_id = t.run_id AND l.rank = t.rank;
