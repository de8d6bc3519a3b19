-- window_buckets: the step windows for finding an event's window by an equality join. Each rank's time is cut into
-- buckets of width (its windows' span / their count, at least its longest window / 64, so that no window lists
-- more than 65 buckets however far one reaches), and every non-empty window is listed once per bucket it
-- touches. An event looks up the bucket of an instant (start_ns // width) and compares with the few windows listed
-- there, where a join on run and rank alone compares it with every window of its rank: events x steps pairs (7.9
-- billion for a 6M-kernel rank of 1,313 steps). Non-empty windows do not overlap (step_windows), so an instant
-- lies in at most one; an event spanning several buckets finds each window it overlaps once, in the bucket of the
-- overlap's first instant. Empty windows are left out: no event time lies in them.
-- Columns: run_id, rank, width (BIGINT ns: the rank's bucket width), bucket (BIGINT: start_ns // width of the
--   instants it holds), step, start_ns, end_ns (the window, as step_windows has it).
CREATE OR REPLACE VIEW window_buckets AS
WITH win AS (
    SELECT run_id, rank, step, start_ns, end_ns,
           greatest((max(end_ns) OVER r - min(start_ns) OVER r) // count(*) OVER r,
                    max(end_ns - start_ns) OVER r // 64, 1) AS width
    FROM step_windows
    WHERE end_ns > start_ns
    WINDOW r AS (PARTITION BY run_id, rank)
)
SELECT run_id, rank, width, unnest(range(start_ns // width, (end_ns - 1) // width + 1)) AS bucket, step, start_ns,
       end_ns
FROM win;
