-- rank_step_breakdown: where each rank's step time went (DESIGN §4). One row per (run_id, rank, step).
-- Columns: run_id, rank, tp, cp, ep, dp, pp (layout coordinates, NULL when unknown), step, then BIGINT ns:
--   TOTAL_ns      step window length = COMP_ns + MP_WAIT_ns + CP_WAIT_ns + EP_WAIT_ns + DP_WAIT_ns + PP_WAIT_ns
--                 + OTHER_WAIT_ns + IDLE_ns, exactly;
--   COMP_ns       time some compute / memcpy / memset event runs (union, so nesting and streams never double count);
--   *_WAIT_ns     exposed communication (a collective runs and no COMP does), each instant split equally among
--                 the distinct dims running then; MP_WAIT is TP; the integer remainder of a split (summed over the
--                 step per set of running dims) goes one ns each to the dims of the set in the order TP, CP, EP, DP,
--                 PP, OTHER;
--   IDLE_ns       nothing of the above runs (host-bound gaps, launch latency, pipeline gaps, sync-only time);
--   OVERLAPPED_ns communication hidden under COMP (beside TOTAL, not inside it).
CREATE OR REPLACE VIEW rank_step_breakdown AS
WITH states AS (  -- time per state: busy or not, and which dims communicate (at most 2^7 rows per rank and step)
    SELECT run_id, rank, step, busy, tp, cp, ep, dp, pp, other,
           tp::INT + cp::INT + ep::INT + dp::INT + pp::INT + other::INT AS n_dims, sum(end_ns - start_ns) AS len
    FROM step_segments
    GROUP BY ALL
),
split AS (  -- exposed time of each set of dims: each gets len // n, the first (len % n) of them in order one ns more
    SELECT *, len // n_dims AS q, len % n_dims AS r
    FROM states
    WHERE NOT busy AND n_dims > 0
),
charged AS (
    SELECT run_id, rank, step,
           sum(CASE WHEN tp THEN q + (r > 0)::INT ELSE 0 END) AS MP_WAIT_ns,
           sum(CASE WHEN cp THEN q + (r > tp::INT)::INT ELSE 0 END) AS CP_WAIT_ns,
           sum(CASE WHEN ep THEN q + (r > tp::INT + cp::INT)::INT ELSE 0 END) AS EP_WAIT_ns,
           sum(CASE WHEN dp THEN q + (r > tp::INT + cp::INT + ep::INT)::INT ELSE 0 END) AS DP_WAIT_ns,
           sum(CASE WHEN pp THEN q + (r > tp::INT + cp::INT + ep::INT + dp::INT)::INT ELSE 0 END) AS PP_WAIT_ns,
           sum(CASE WHEN other THEN q ELSE 0 END) AS OTHER_WAIT_ns  -- last in order: never a remainder
    FROM split
    GROUP BY run_id, rank, step
),
totals AS (
    SELECT run_id, rank, step,
           sum(len) FILTER (WHERE busy) AS COMP_ns,
           sum(len) FILTER (WHERE NOT busy AND n_dims = 0) AS IDLE_ns,
           sum(len) FILTER (WHERE busy AND n_dims > 0) AS OVERLAPPED_ns
    FROM states
    GROUP BY run_id, rank, step
)
SELECT w.run_id, w.rank, k.tp, k.cp, k.ep, k.dp, k.pp, w.step,
       w.end_ns - w.start_ns AS TOTAL_ns,
       coalesce(t.COMP_ns, 0)::BIGINT AS COMP_ns,
       coalesce(c.MP_WAIT_ns, 0)::BIGINT AS MP_WAIT_ns,
       coalesce(c.CP_WAIT_ns, 0)::BIGINT AS CP_WAIT_ns,
       coalesce(c.EP_WAIT_ns, 0)::BIGINT AS EP_WAIT_ns,
       coalesce(c.DP_WAIT_ns, 0)::BIGINT AS DP_WAIT_ns,
       coalesce(c.PP_WAIT_ns, 0)::BIGINT AS PP_WAIT_ns,
       coalesce(c.OTHER_WAIT_ns, 0)::BIGINT AS OTHER_WAIT_ns,
       coalesce(t.IDLE_ns, 0)::BIGINT AS IDLE_ns,
       coalesce(t.OVERLAPPED_ns, 0)::BIGINT AS OVERLAPPED_ns
FROM step_windows w
LEFT JOIN totals t USING (run_id, rank, step)
LEFT JOIN charged c USING (run_id, rank, step)
LEFT JOIN ranks k ON k.run_id = w.run_id AND k.rank = w.rank;
