-- rank_breakdown: each rank's typical step — the mean of rank_step_breakdown over its steps after the first (the
-- first step carries warm-up: allocator, NCCL setup, compilation); a rank with a single step keeps it.
-- Columns: run_id, rank, tp, cp, ep, dp, pp, steps (INTEGER: steps averaged), then DOUBLE ns per step:
--   TOTAL_ns, COMP_ns, MP_WAIT_ns, CP_WAIT_ns, EP_WAIT_ns, DP_WAIT_ns, PP_WAIT_ns, OTHER_WAIT_ns, IDLE_ns,
--   OVERLAPPED_ns (same meanings as rank_step_breakdown; TOTAL = COMP + Σ*_WAIT + IDLE up to float rounding).
CREATE OR REPLACE VIEW rank_breakdown AS
WITH ordered AS (
    SELECT *, count(*) OVER r AS n_steps, min(step) OVER r AS first_step
    FROM rank_step_breakdown
    WINDOW r AS (PARTITION BY run_id, rank)
)
SELECT run_id, rank, any_value(tp) AS tp, any_value(cp) AS cp, any_value(ep) AS ep, any_value(dp) AS dp,
       any_value(pp) AS pp, count(*)::INTEGER AS steps,
       avg(TOTAL_ns) AS TOTAL_ns, avg(COMP_ns) AS COMP_ns, avg(MP_WAIT_ns) AS MP_WAIT_ns,
       avg(CP_WAIT_ns) AS CP_WAIT_ns, avg(EP_WAIT_ns) AS EP_WAIT_ns, avg(DP_WAIT_ns) AS DP_WAIT_ns,
       avg(PP_WAIT_ns) AS PP_WAIT_ns, avg(OTHER_WAIT_ns) AS OTHER_WAIT_ns, avg(IDLE_ns) AS IDLE_ns,
       avg(OVERLAPPED_ns) AS OVERLAPPED_ns
FROM ordered
WHERE n_steps = 1 OR step > first_step
GROUP BY run_id, rank;
