-- queue_length: HTA's queue length, the device events a stream holds launched but not yet started, as a step
-- function: +1 when the host's runtime call that queues an event starts (launch_ns), -1 when the event starts on
-- the device. One sort and a running sum over those +1/-1 changes, summed per instant first, so events that change
-- the count at the same nanosecond need no order among them. Events without a launch record (CPU-only and Ascend
-- runs; kernels whose call fell before the capture) are not in it; one that starts before its launch call (clock
-- error) leaves the queue when it is queued.
-- Columns: run_id, rank, stream (BIGINT), ts_ns (BIGINT ns: the count changes here), until_ns (BIGINT ns: the next
--   change on the stream; NULL after the last, where the queue is empty), queue_length (BIGINT: from ts_ns to until_ns).
CREATE OR REPLACE VIEW queue_length AS
WITH changes AS (
    SELECT run_id, rank, stream, ts_ns, sum(d) AS d
    FROM (SELECT run_id, rank, stream, launch_ns AS ts_ns, 1 AS d FROM device_events WHERE launch_ns IS NOT NULL
          UNION ALL
          SELECT run_id, rank, stream, greatest(start_ns, launch_ns), -1 FROM device_events WHERE launch_ns IS NOT NULL)
    GROUP BY run_id, rank, stream, ts_ns
    HAVING sum(d) <> 0
)
SELECT run_id, rank, stream, ts_ns, lead(ts_ns) OVER w AS until_ns,
       sum(d) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)::BIGINT AS queue_length
FROM changes
WINDOW w AS (PARTITION BY run_id, rank, stream ORDER BY ts_ns);
