-- event_time: each device event's own share of its rank-step's COMP and exposed communication (DESIGN §9), so that
-- the events of a rank-step add up to its rank_step_breakdown parts exactly.
-- Ownership: an instant of COMP belongs to the compute / memcpy / memset event that started first among those
-- running then (ties: the longer, then the lower event_id): sorted by start, an event owns what lies past the
-- latest end of the events before it. Exposed communication of a dim belongs, the same way, to the earliest-started
-- collective of that dim running then; an exposed piece shared by n dims gives each 1/n as the breakdown does, and
-- the integer remainders of that split (a few ns per set of dims) go to the owner with the most time in the set.
-- Columns: run_id, rank, step, event_id (BIGINT: one row per event with time in the window, clipped to it),
--   COMP_ns, MP_WAIT_ns, CP_WAIT_ns, EP_WAIT_ns, DP_WAIT_ns, PP_WAIT_ns, OTHER_WAIT_ns (BIGINT ns it owns).
CREATE OR REPLACE VIEW event_time AS
WITH clipped AS (
    SELECT e.run_id, e.rank, e.step, e.event_id, e.start_ns, e.end_ns,
           CASE WHEN e.category <> 'comm' THEN 'COMP'
                ELSE CASE split_part(c.dim, '-', 1) WHEN 'TP' THEN 'TP' WHEN 'CP' THEN 'CP' WHEN 'EP' THEN 'EP'
                          WHEN 'DP' THEN 'DP' WHEN 'PP' THEN 'PP' ELSE 'OTHER' END END AS lane
    FROM window_events e
    LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
),
owned AS (  -- the part of each event no earlier-started event of its lane covers: these tile the lane's union
    SELECT *, greatest(start_ns, coalesce(max(end_ns) OVER w, start_ns)) AS own_start
    FROM clipped
    WINDOW w AS (PARTITION BY run_id, rank, step, lane ORDER BY start_ns, end_ns DESC, event_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
points AS (  -- the owned intervals' edges, one bit per lane (COMP lowest): a lane's owned intervals never overlap
    SELECT run_id, rank, step, unnest([own_start, end_ns]) AS t, unnest([bit, -bit]) AS delta
    FROM (SELECT *, 1 << CASE lane WHEN 'COMP' THEN 0 WHEN 'TP' THEN 1 WHEN 'CP' THEN 2 WHEN 'EP' THEN 3
                                   WHEN 'DP' THEN 4 WHEN 'PP' THEN 5 ELSE 6 END AS bit
          FROM owned WHERE end_ns > own_start)
),
pieces AS (  -- the sweep over them: which lanes run in each piece (the breakdown's step_segments, up to where the
             -- pieces are cut); points sharing a time make zero-length pieces, all but the last
    SELECT run_id, rank, step, t AS start_ns, lead(t) OVER w - t AS len, (sum(delta) OVER w)::INTEGER AS state
    FROM points
    WINDOW w AS (PARTITION BY run_id, rank, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
exposed AS (  -- the exposed pieces (no COMP, some dim), one row per dim running in them, with the dim's place in the
              -- order TP, CP, EP, DP, PP, OTHER among them (dims: a bit per dim, TP lowest)
    SELECT run_id, rank, step, start_ns, len, ['TP', 'CP', 'EP', 'DP', 'PP', 'OTHER'][i + 1] AS lane,
           bit_count(state) AS n_dims, state >> 1 AS dims, bit_count((state >> 1) & ((1 << i) - 1)) AS place
    FROM pieces, range(6) AS r(i)
    WHERE len > 0 AND state & 1 = 0 AND (state >> (i + 1)) & 1 = 1
),
marks AS (  -- the owned intervals of each comm lane and its exposed pieces, on one line per lane
    SELECT run_id, rank, step, lane, own_start AS t, event_id, NULL AS len, NULL AS n_dims, NULL AS dims, NULL AS place
    FROM owned WHERE lane <> 'COMP' AND end_ns > own_start
    UNION ALL
    SELECT run_id, rank, step, lane, start_ns, NULL, len, n_dims, dims, place FROM exposed
),
claimed AS (  -- a piece lies inside one owned interval of its dim (pieces are cut at every event boundary): the
              -- last one to start at or before it (a window, not an ASOF join: DuckDB plans that as a nested loop
              -- when it underestimates the pieces, quadratic in a rank's events)
    SELECT run_id, rank, step, lane, dims, n_dims, place, owner AS event_id, sum(len) AS len
    FROM (SELECT *, last_value(event_id IGNORE NULLS) OVER (PARTITION BY run_id, rank, step, lane
                                                             ORDER BY t, event_id IS NULL ROWS UNBOUNDED PRECEDING) AS owner
          FROM marks)
    WHERE event_id IS NULL
    GROUP BY ALL
),
charged AS (  -- 1/n of each owner's time in a set of dims; the set's remainder as the breakdown splits it
    SELECT *, len // n_dims + CASE WHEN row_number() OVER s = 1
              THEN (sum(len) OVER s) // n_dims + ((sum(len) OVER s) % n_dims > place)::INT
                   - sum(len // n_dims) OVER s ELSE 0 END AS wait_ns
    FROM claimed
    WINDOW s AS (PARTITION BY run_id, rank, step, lane, dims ORDER BY len DESC, event_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
waits AS (
    SELECT run_id, rank, step, event_id,
           sum(wait_ns) FILTER (WHERE lane = 'TP') AS MP_WAIT_ns, sum(wait_ns) FILTER (WHERE lane = 'CP') AS CP_WAIT_ns,
           sum(wait_ns) FILTER (WHERE lane = 'EP') AS EP_WAIT_ns, sum(wait_ns) FILTER (WHERE lane = 'DP') AS DP_WAIT_ns,
           sum(wait_ns) FILTER (WHERE lane = 'PP') AS PP_WAIT_ns,
           sum(wait_ns) FILTER (WHERE lane = 'OTHER') AS OTHER_WAIT_ns
    FROM charged
    GROUP BY ALL
)
SELECT o.run_id, o.rank, o.step, o.event_id,
       CASE WHEN o.lane = 'COMP' THEN greatest(o.end_ns - o.own_start, 0) ELSE 0 END::BIGINT AS COMP_ns,
       coalesce(w.MP_WAIT_ns, 0)::BIGINT AS MP_WAIT_ns, coalesce(w.CP_WAIT_ns, 0)::BIGINT AS CP_WAIT_ns,
       coalesce(w.EP_WAIT_ns, 0)::BIGINT AS EP_WAIT_ns, coalesce(w.DP_WAIT_ns, 0)::BIGINT AS DP_WAIT_ns,
       coalesce(w.PP_WAIT_ns, 0)::BIGINT AS PP_WAIT_ns, coalesce(w.OTHER_WAIT_ns, 0)::BIGINT AS OTHER_WAIT_ns
FROM owned o
LEFT JOIN waits w USING (run_id, rank, step, event_id);
