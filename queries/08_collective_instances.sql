-- collective_instances: one row per collective instance of a run, matched across its ranks.
-- Columns: run_id, instance, op ('Recv/Send' for a point-to-point pair), dim, pg (as the collectives rows say),
--   ranks_seen (INTEGER), ranks (INTEGER[] sorted), first_start_ns, last_start_ns, first_end_ns, last_end_ns
--   (BIGINT ns), start_spread_ns = last_start - first_start, end_spread_ns = last_end - first_end (BIGINT ns),
--   last_rank (INTEGER: the last to arrive, whom the others waited for), total_wait_ns (BIGINT ns: Σ wait_ns over the
--   ranks — the wait the last rank caused), max_wait_ns (BIGINT ns).
CREATE OR REPLACE VIEW collective_instances AS
SELECT run_id, instance, string_agg(DISTINCT op, '/' ORDER BY op) AS op, any_value(dim) AS dim, any_value(pg) AS pg,
       count(*)::INTEGER AS ranks_seen, list_sort(list(rank)) AS ranks,
       min(start_ns) AS first_start_ns, max(start_ns) AS last_start_ns,
       min(end_ns) AS first_end_ns, max(end_ns) AS last_end_ns,
       max(start_ns) - min(start_ns) AS start_spread_ns, max(end_ns) - min(end_ns) AS end_spread_ns,
       min(rank) FILTER (WHERE arrival = 1) AS last_rank,
       sum(wait_ns)::BIGINT AS total_wait_ns, max(wait_ns) AS max_wait_ns
FROM collective_waits
GROUP BY run_id, instance;
