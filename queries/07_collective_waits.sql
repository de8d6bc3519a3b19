-- collective_waits: each rank's part in each collective instance (matched across ranks by `instance`: the trace's
-- Seq / Comms Id where it has one, else order of issue within the process group — see ingest/run_data.py).
-- Columns: run_id, instance, rank, event_id, op, dim, pg, start_ns, end_ns (BIGINT ns of the rank's kernel / task),
--   latest_start_ns (BIGINT ns: when the last rank arrived), wait_ns (BIGINT ns: how long this rank's kernel ran
--   before the last rank arrived = min(latest_start, end) - start; 0 for the last rank itself),
--   arrival (INTEGER: 1 = last to arrive, ties broken by lower rank), ranks_seen (INTEGER: ranks in the store
--   that took part; 1 means the other ranks were not traced and nothing can be said about skew).
CREATE OR REPLACE VIEW collective_waits AS
WITH joined AS (
    SELECT c.run_id, c.instance, c.rank, c.event_id, c.op, c.dim, c.pg, e.start_ns, e.end_ns,
           max(e.start_ns) OVER i AS latest_start_ns,
           row_number() OVER (PARTITION BY c.run_id, c.instance ORDER BY e.start_ns DESC, c.rank)::INTEGER AS arrival,
           count(*) OVER i::INTEGER AS ranks_seen
    FROM collectives c
    JOIN device_events e ON e.run_id = c.run_id AND e.rank = c.rank AND e.event_id = c.event_id
    WHERE c.instance IS NOT NULL
    WINDOW i AS (PARTITION BY c.run_id, c.instance)
)
SELECT run_id, instance, rank, event_id, op, dim, pg, start_ns, end_ns, latest_start_ns,
       least(latest_start_ns, end_ns) - start_ns AS wait_ns, arrival, ranks_seen
FROM joined;
