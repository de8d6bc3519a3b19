-- event_launchers: each device event and the host range that launched it, where the store links the two (Kineto:
-- the CPU op whose External id the kernel carries, event_ops.op_id), with where on the host the launch was: its
-- runtime call's start (device_events.launch_ns), which lies inside the op, or the op's start where the call was not
-- recorded. An export draws an arrow from there to the event, so a slow kernel leads back to its op and layer.
-- Columns: run_id, rank, event_id (BIGINT: the device event), op_id (BIGINT: the op's, as host_ranges), thread
--   (BIGINT: the op's), op (VARCHAR: its name), op_start_ns, op_end_ns, launch_ns (BIGINT ns; op_start_ns <=
--   launch_ns <= op_end_ns), depth (INTEGER: the op's, as host_ranges).
CREATE OR REPLACE VIEW event_launchers AS
SELECT o.run_id, o.rank, o.event_id, o.op_id, h.thread, h.name AS op, h.start_ns AS op_start_ns, h.end_ns AS op_end_ns,
       least(greatest(coalesce(e.launch_ns, h.start_ns), h.start_ns), h.end_ns) AS launch_ns, h.depth
FROM event_ops o
JOIN device_events e ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.event_id
JOIN host_ranges h ON h.run_id = o.run_id AND h.rank = o.rank AND h.op_id = o.op_id;
