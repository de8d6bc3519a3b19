-- stragglers: per rank, how its own work and its lateness compare with its pipeline stage (the ranks that should do
-- the same work). The `stragglers` command applies the user's threshold to COMP_excess_pct.
-- Columns: run_id, rank, pp, steps (INTEGER), COMP_ns (DOUBLE ns: its typical step's COMP, rank_breakdown),
--   stage_median_COMP_ns (DOUBLE ns: median of COMP_ns over the stage's ranks), COMP_excess_pct (DOUBLE %:
--   100·(COMP / stage median − 1)), straggler_stage (BOOLEAN: the rank is in the stage with the largest mean COMP,
--   ties to the lower stage), last_arrivals (INTEGER: collective instances with ≥ 2 traced ranks where it arrived
--   last), caused_wait_ns (BIGINT ns: the other ranks' total wait in those instances).
CREATE OR REPLACE VIEW stragglers AS
WITH stage AS (
    SELECT run_id, pp, median(COMP_ns) AS stage_median_COMP_ns
    FROM rank_breakdown
    GROUP BY run_id, pp
),
top_stage AS (
    SELECT run_id, pp
    FROM stage_breakdown
    WHERE step IS NULL
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY COMP_mean_ns DESC, pp NULLS FIRST) = 1
),
late AS (
    SELECT run_id, last_rank AS rank, count(*)::INTEGER AS last_arrivals, sum(total_wait_ns)::BIGINT AS caused_wait_ns
    FROM collective_instances
    WHERE ranks_seen > 1
    GROUP BY run_id, last_rank
)
SELECT r.run_id, r.rank, r.pp, r.steps, r.COMP_ns, s.stage_median_COMP_ns,
       100 * r.COMP_ns / nullif(s.stage_median_COMP_ns, 0) - 100 AS COMP_excess_pct,
       t.run_id IS NOT NULL AS straggler_stage,
       coalesce(l.last_arrivals, 0) AS last_arrivals, coalesce(l.caused_wait_ns, 0) AS caused_wait_ns
FROM rank_breakdown r
JOIN stage s ON s.run_id = r.run_id AND s.pp IS NOT DISTINCT FROM r.pp
LEFT JOIN top_stage t ON t.run_id = r.run_id AND t.pp IS NOT DISTINCT FROM r.pp
LEFT JOIN late l ON l.run_id = r.run_id AND l.rank = r.rank;
