-- stage_breakdown: the breakdown per pipeline stage — mean and max over the stage's ranks, per step and, in the
-- rows with step NULL, of each rank's typical step (rank_breakdown: steps after the first).
-- Columns: run_id, pp (stage; NULL when the run has no layout: all ranks form one stage), step (NULL = typical),
--   ranks (INTEGER), then for M in TOTAL, COMP, MP_WAIT, CP_WAIT, EP_WAIT, DP_WAIT, PP_WAIT, OTHER_WAIT, IDLE,
--   OVERLAPPED: M_mean_ns and M_max_ns (DOUBLE ns per step).
CREATE OR REPLACE VIEW stage_breakdown AS
SELECT run_id, pp, step, count(*)::INTEGER AS ranks,
       avg(TOTAL_ns) AS TOTAL_mean_ns, max(TOTAL_ns) AS TOTAL_max_ns,
       avg(COMP_ns) AS COMP_mean_ns, max(COMP_ns) AS COMP_max_ns,
       avg(MP_WAIT_ns) AS MP_WAIT_mean_ns, max(MP_WAIT_ns) AS MP_WAIT_max_ns,
       avg(CP_WAIT_ns) AS CP_WAIT_mean_ns, max(CP_WAIT_ns) AS CP_WAIT_max_ns,
       avg(EP_WAIT_ns) AS EP_WAIT_mean_ns, max(EP_WAIT_ns) AS EP_WAIT_max_ns,
       avg(DP_WAIT_ns) AS DP_WAIT_mean_ns, max(DP_WAIT_ns) AS DP_WAIT_max_ns,
       avg(PP_WAIT_ns) AS PP_WAIT_mean_ns, max(PP_WAIT_ns) AS PP_WAIT_max_ns,
       avg(OTHER_WAIT_ns) AS OTHER_WAIT_mean_ns, max(OTHER_WAIT_ns) AS OTHER_WAIT_max_ns,
       avg(IDLE_ns) AS IDLE_mean_ns, max(IDLE_ns) AS IDLE_max_ns,
       avg(OVERLAPPED_ns) AS OVERLAPPED_mean_ns, max(OVERLAPPED_ns) AS OVERLAPPED_max_ns
FROM rank_breakdown
GROUP BY run_id, pp, step;
