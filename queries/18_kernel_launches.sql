-- kernel_launches: HTA's kernel-launch statistics per event. Each device event with a launch record (launch_ns: the
-- start of the host runtime call that queued it, cudaLaunchKernel / cudaMemcpyAsync / ...; Kineto GPU traces and
-- nsys record it, CPU-only and Ascend runs do not), how long it took from that call to its start on the device, and
-- whether it ran for less time than launching it costs.
-- The delay runs from the call's start, not from its end as HTA's launch_delay does: the store keeps the call's start
-- only, so the delay holds the call's own cost as well and is never below it. An event that starts before its launch
-- call (clock error between host and device) has its delay read as 0, as HTA clips it.
-- The launch cost is measured where nothing else can hide in the delay: the median delay, per rank, of the events
-- launched onto an idle device (every event of the rank that started before it had ended when its call began: no
-- queue on its stream, nothing running on another that it might wait for), where the delay is the call plus the
-- driver's path to the device. (An idle stream alone is not enough: a kernel that waits for another stream's work
-- looks like a slow launch; on traces synthesized with a 5 µs launch lead it gave 400 µs, the idle device 5 µs.) HTA's "short kernels" compare a kernel with its runtime call's
-- duration, which the store does not keep; comparing with the event's own delay instead would count every kernel of
-- a device-bound run as short (its delays are mostly time queued behind earlier kernels: 1.5 ms on the H200 GPT
-- trace, against 7 µs to launch onto an idle device).
-- Columns: run_id, rank, pp (stage, NULL without a layout), step (INTEGER: the step window it starts in, NULL outside
--   every window), event_id, stream (BIGINT), name, short_name (kernel_names), category, launch_ns, start_ns
--   (BIGINT ns), duration_ns, delay_ns (BIGINT ns: start_ns - launch_ns, at least 0), idle_device (BOOLEAN: launched
--   onto an idle device), launch_cost_ns (DOUBLE ns: the rank's launch cost, NULL when no event found the device
--   idle), short (BOOLEAN: duration_ns < launch_cost_ns).
CREATE OR REPLACE VIEW kernel_launches AS
WITH events AS (
    SELECT *, end_ns - start_ns AS duration_ns, greatest(start_ns - launch_ns, 0) AS delay_ns,
           coalesce(max(end_ns) OVER (PARTITION BY run_id, rank ORDER BY start_ns, event_id
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) <= launch_ns, true) AS idle_device
    FROM device_events
),
widths AS (SELECT DISTINCT run_id, rank, width FROM window_buckets),
cost AS (
    SELECT run_id, rank, median(delay_ns) AS launch_cost_ns
    FROM events
    WHERE launch_ns IS NOT NULL AND idle_device
    GROUP BY run_id, rank
)
SELECT e.run_id, e.rank, k.pp, w.step, e.event_id, e.stream, e.name, n.short_name, e.category, e.launch_ns,
       e.start_ns, e.duration_ns, e.delay_ns, e.idle_device, c.launch_cost_ns, e.duration_ns < c.launch_cost_ns AS short
FROM (SELECT v.*, v.start_ns // b.width AS bucket  -- the bucket of its start (window_buckets)
      FROM events v LEFT JOIN widths b ON b.run_id = v.run_id AND b.rank = v.rank) e
JOIN kernel_names n ON n.run_id = e.run_id AND n.name = e.name
LEFT JOIN cost c ON c.run_id = e.run_id AND c.rank = e.rank
LEFT JOIN window_buckets w ON w.run_id = e.run_id AND w.rank = e.rank AND w.bucket = e.bucket
                           AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns
LEFT JOIN ranks k ON k.run_id = e.run_id AND k.rank = e.rank
WHERE e.launch_ns IS NOT NULL;
