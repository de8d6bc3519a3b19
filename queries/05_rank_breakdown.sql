-- rank_breakdown: rank_step_breakdown per step, plus each rank's typical step as the row with step NULL: the mean
-- over its steps after the first (the first carries warm-up: allocator, NCCL setup, compilation); a rank with a
-- single step keeps it. Reports, the stage view and the straggler view read this one view, so the sweep runs once.
-- Columns: run_id, rank, tp, cp, ep, dp, pp, step (NULL = typical), steps (INTEGER: steps averaged), then DOUBLE ns
--   per step: TOTAL_ns, COMP_ns, MP_WAIT_ns, CP_WAIT_ns, EP_WAIT_ns, DP_WAIT_ns, PP_WAIT_ns, OTHER_WAIT_ns, IDLE_ns,
--   OVERLAPPED_ns (meanings as in rank_step_breakdown; in typical rows TOTAL = COMP + Σ*_WAIT + IDLE up to rounding).
CREATE OR REPLACE VIEW rank_breakdown AS
WITH per_step AS (
    SELECT *, count(*) OVER r = 1 OR step > min(step) OVER r AS steady
    FROM rank_step_breakdown
    WINDOW r AS (PARTITION BY run_id, rank)
)
SELECT run_id, rank, tp, cp, ep, dp, pp, step, 1 AS steps,
       TOTAL_ns::DOUBLE AS TOTAL_ns, COMP_ns::DOUBLE AS COMP_ns, MP_WAIT_ns::DOUBLE AS MP_WAIT_ns,
       CP_WAIT_ns::DOUBLE AS CP_WAIT_ns, EP_WAIT_ns::DOUBLE AS EP_WAIT_ns, DP_WAIT_ns::DOUBLE AS DP_WAIT_ns,
       PP_WAIT_ns::DOUBLE AS PP_WAIT_ns, OTHER_WAIT_ns::DOUBLE AS OTHER_WAIT_ns, IDLE_ns::DOUBLE AS IDLE_ns,
       OVERLAPPED_ns::DOUBLE AS OVERLAPPED_ns
FROM per_step
UNION ALL
SELECT run_id, rank, any_value(tp), any_value(cp), any_value(ep), any_value(dp), any_value(pp), NULL,
       count(*)::INTEGER, avg(TOTAL_ns), avg(COMP_ns), avg(MP_WAIT_ns), avg(CP_WAIT_ns), avg(EP_WAIT_ns),
       avg(DP_WAIT_ns), avg(PP_WAIT_ns), avg(OTHER_WAIT_ns), avg(IDLE_ns), avg(OVERLAPPED_ns)
FROM per_step
WHERE steady
GROUP BY run_id, rank;
