-- comm_matrix: traffic per ordered rank pair (src -> dst), from point-to-point messages and all-to-all exchanges.
-- A Send row is one message rank -> peer; a Recv row counts (peer -> rank) only when its instance has no Send row in
-- the store (the sender was not traced). An AllToAll instance sends bytes / n from each traced member to each other
-- member of its process group: collectives keep no per-peer split, so an even split is assumed. Each message takes
-- its instance's transfer time (collective_bandwidth.time_ns).
-- Columns: run_id, src, dst (INTEGER global ranks), dim, messages (BIGINT), bytes (BIGINT), time_ns (BIGINT: sum of
--   the messages' transfer times), GBps (DOUBLE: bytes / time_ns, GB = 1e9 bytes; NULL when no time),
--   assumed_bytes (BIGINT: the part of bytes that is an all-to-all's assumed even split, not a recorded message).
CREATE OR REPLACE VIEW comm_matrix AS
WITH p2p AS (
    SELECT c.run_id, CASE c.op WHEN 'Send' THEN c.rank ELSE c.peer END AS src,
           CASE c.op WHEN 'Send' THEN c.peer ELSE c.rank END AS dst, c.dim, c.bytes, b.time_ns, 0 AS assumed
    FROM collectives c
    JOIN collective_bandwidth b ON b.run_id = c.run_id AND b.instance = c.instance
    WHERE c.peer IS NOT NULL AND (c.op = 'Send' OR (c.op = 'Recv' AND b.op = 'Recv'))
),
all_to_all AS (
    SELECT c.run_id, c.rank AS src, m.dst, c.dim, c.bytes // len(g.ranks) AS bytes, b.time_ns,
           c.bytes // len(g.ranks) AS assumed
    FROM collectives c
    JOIN collective_bandwidth b ON b.run_id = c.run_id AND b.instance = c.instance
    JOIN process_groups g ON g.run_id = c.run_id AND g.pg = c.pg,
    unnest(g.ranks) AS m(dst)
    WHERE c.op = 'AllToAll' AND m.dst <> c.rank
)
SELECT run_id, src::INTEGER AS src, dst::INTEGER AS dst, dim, count(*) AS messages, sum(bytes)::BIGINT AS bytes,
       sum(time_ns)::BIGINT AS time_ns, sum(bytes) / nullif(sum(time_ns), 0) AS GBps,
       sum(assumed)::BIGINT AS assumed_bytes
FROM (SELECT * FROM p2p UNION ALL SELECT * FROM all_to_all)
GROUP BY ALL;
