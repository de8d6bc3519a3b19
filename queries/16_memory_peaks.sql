-- memory_peaks: each rank's allocator level per step from the memory table (Kineto [memory] samples of the rank's
-- device, Ascend PTA records, CPU samples of CPU-only runs). A sample holds the level from its time until the next
-- one, so a step starts at the level of the rank's last sample at or before the window's start.
-- Columns: run_id, rank, step, samples (BIGINT: samples inside the window), start_allocated_bytes (BIGINT: level at
--   the window's start; NULL before the first sample), peak_allocated_bytes, peak_reserved_bytes (BIGINT: the
--   largest level during the step, the carried-in level included), end_allocated_bytes (BIGINT: level at the end).
CREATE OR REPLACE VIEW memory_peaks AS
WITH carried AS (
    SELECT w.run_id, w.rank, w.step, m.allocated_bytes, m.reserved_bytes
    FROM step_windows w
    ASOF JOIN memory m ON m.run_id = w.run_id AND m.rank = w.rank AND m.ts_ns <= w.start_ns
),
inside AS (
    SELECT w.run_id, w.rank, w.step, count(*) AS samples, max(m.allocated_bytes) AS allocated_bytes,
           max(m.reserved_bytes) AS reserved_bytes, arg_max(m.allocated_bytes, m.ts_ns) AS end_allocated_bytes
    FROM step_windows w
    JOIN memory m ON m.run_id = w.run_id AND m.rank = w.rank AND m.ts_ns > w.start_ns AND m.ts_ns < w.end_ns
    GROUP BY w.run_id, w.rank, w.step
)
SELECT run_id, rank, step, coalesce(i.samples, 0) AS samples, c.allocated_bytes AS start_allocated_bytes,
       greatest(i.allocated_bytes, c.allocated_bytes) AS peak_allocated_bytes,
       greatest(i.reserved_bytes, c.reserved_bytes) AS peak_reserved_bytes,
       coalesce(i.end_allocated_bytes, c.allocated_bytes) AS end_allocated_bytes
FROM inside i
FULL JOIN carried c USING (run_id, rank, step);
