-- activity_intervals: busy(c) of DESIGN §4 — the union of each activity class's events on a rank within a step,
-- as maximal intervals (gaps-and-islands over step_segments: a new island starts where a piece does not touch the
-- previous piece of the same class).
-- Columns: run_id, rank, step, lane ('COMP' for compute/memcpy/memset, else the comm dim 'TP','CP','EP','DP','PP',
--   'OTHER'), start_ns, end_ns (BIGINT ns, end exclusive).
CREATE OR REPLACE VIEW activity_intervals AS
WITH pieces AS (
    SELECT run_id, rank, step, start_ns, end_ns, lane
    FROM step_segments
    UNPIVOT (active FOR lane IN (busy AS 'COMP', tp AS 'TP', cp AS 'CP', ep AS 'EP', dp AS 'DP', pp AS 'PP',
                                 other AS 'OTHER'))
    WHERE active
),
marked AS (
    SELECT *, CASE WHEN start_ns = lag(end_ns) OVER w THEN 0 ELSE 1 END AS starts_island
    FROM pieces
    WINDOW w AS (PARTITION BY run_id, rank, step, lane ORDER BY start_ns)
),
numbered AS (
    SELECT *, sum(starts_island) OVER (PARTITION BY run_id, rank, step, lane ORDER BY start_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS island
    FROM marked
)
SELECT run_id, rank, step, lane, min(start_ns) AS start_ns, max(end_ns) AS end_ns
FROM numbered
GROUP BY run_id, rank, step, lane, island;
