-- critical_path_nodes: the nodes of the cross-rank critical-path graph (traceana/critical_path.py walks them): every
-- device event that does work or communicates in a rank's step window, clipped to the window, with the collective
-- instance that links it to other ranks. Edges are implicit: within a rank, an event follows whatever ran just
-- before its start; across ranks, an instance's member follows the last arriver (last_rank, at last_start_ns).
-- Columns: run_id, step, rank, pp (stage, NULL without a layout), event_id, stream, start_ns, end_ns (BIGINT ns on
--   the run timeline, clipped to the rank's step window), category (compute / memcpy / memset / comm), name,
--   dim (VARCHAR: the collective's dim; NULL for work and for comm without a collectives row),
--   instance (BIGINT, NULL when unmatched), ranks_seen (INTEGER: traced ranks in the instance), last_rank (INTEGER:
--   the instance's last arriver), last_start_ns (BIGINT ns: when it arrived), launch_ns (BIGINT ns: when the host
--   launched the event; NULL when not recorded).
CREATE OR REPLACE VIEW critical_path_nodes AS
SELECT w.run_id, w.step, e.rank, k.pp, e.event_id, e.stream,
       greatest(e.start_ns, w.start_ns) AS start_ns, least(e.end_ns, w.end_ns) AS end_ns,
       e.category, e.name, c.dim, c.instance, i.ranks_seen, i.last_rank, i.last_start_ns, e.launch_ns
FROM device_events e
JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns < w.end_ns AND e.end_ns > w.start_ns
LEFT JOIN ranks k ON k.run_id = e.run_id AND k.rank = e.rank
LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
LEFT JOIN collective_instances i ON i.run_id = c.run_id AND i.instance = c.instance
WHERE e.category IN ('compute', 'memcpy', 'memset', 'comm') AND e.end_ns > e.start_ns;
