-- step_windows: the time window of every (run, rank, step) the breakdown covers.
-- Columns: run_id, rank, step (INTEGER), start_ns, end_ns (BIGINT ns on the run timeline), from_markers (BOOLEAN).
-- Steps come from the `steps` table. A rank without step rows gets one step, numbered 0, spanning its first device
-- event's start to its last device event's end (DESIGN §4: "else the whole trace of a rank is one step").
CREATE OR REPLACE VIEW step_windows AS
SELECT run_id, rank, step, start_ns, end_ns, TRUE AS from_markers
FROM steps
WHERE end_ns > start_ns
UNION ALL
SELECT e.run_id, e.rank, 0 AS step, min(e.start_ns) AS start_ns, max(e.end_ns) AS end_ns, FALSE AS from_markers
FROM device_events e
ANTI JOIN steps s ON s.run_id = e.run_id AND s.rank = e.rank
GROUP BY e.run_id, e.rank;
