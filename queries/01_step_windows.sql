-- step_windows: the time window of every (run, rank, step) the breakdown covers.
-- Columns: run_id, rank, step (INTEGER), start_ns, end_ns (BIGINT ns on the run timeline, end exclusive),
--   from_markers (BOOLEAN: from the steps table; FALSE for the default window).
-- Steps come from the `steps` table: on GPU runs with launch records, device windows that are already contiguous
-- and disjoint (ingest/run_data.py device_step_windows; README "Step windows"); elsewhere the step markers' own
-- ranges, where a step that overlaps the rank's next one is cut at the next one's start, so windows never overlap
-- and no device time is counted twice. A rank without step rows gets one step, numbered 0,
-- from its first device event's start to its last device event's end (DESIGN §4: "the whole trace is one step").
CREATE OR REPLACE VIEW step_windows AS
SELECT run_id, rank, step, start_ns,
       least(end_ns, lead(start_ns) OVER (PARTITION BY run_id, rank ORDER BY start_ns, step)) AS end_ns,
       TRUE AS from_markers
FROM steps
WHERE end_ns > start_ns
UNION ALL
-- the ranks without step rows, found before the aggregate, not after it: where every rank has them (most runs), no
-- event is aggregated
SELECT e.run_id, e.rank, 0 AS step, min(e.start_ns) AS start_ns, max(e.end_ns) AS end_ns, FALSE
FROM device_events e
ANTI JOIN steps s ON s.run_id = e.run_id AND s.rank = e.rank
GROUP BY e.run_id, e.rank;
