-- collective_bandwidth: each collective instance's size, time and bandwidths as nccl-tests defines them
-- (NVIDIA/nccl-tests, doc/PERFORMANCE.md): algbw = S / t and busbw = algbw · factor, the factor per op being
-- AllReduce 2(n-1)/n; AllGather, ReduceScatter and AllToAll (n-1)/n; Broadcast, Reduce, Send, Recv, SendRecv 1.
-- S is nccl-tests' size: the whole buffer. collectives.bytes is a rank's input, so AllGather's S is n × bytes and
-- every other op's S is bytes.
-- t is the time from the last member's arrival to the last member's end: the transfer once all are there (the time
-- a rank's kernel ran before that was waiting, see collective_waits). With one traced rank, its kernel's time.
-- Columns: run_id, instance, op ('Recv/Send' for a matched pair), dim, pg, n (INTEGER: the group's size from
--   process_groups, 2 for point-to-point, NULL when unknown), ranks_seen (INTEGER), ranks (INTEGER[] traced),
--   bytes (BIGINT: largest collectives.bytes of the members), size_bytes (BIGINT: S), start_ns (BIGINT ns: first
--   arrival), last_start_ns (BIGINT ns), time_ns (BIGINT ns: t), algbw_GBps, busbw_GBps (DOUBLE, GB = 1e9 bytes;
--   NULL when S, n or t is unknown or zero), hosts (INTEGER: distinct hosts of the group's ranks, NULL when one is
--   unknown), link ('intra-node', 'inter-node', or NULL when hosts is NULL).
CREATE OR REPLACE VIEW collective_bandwidth AS
WITH largest AS (  -- the largest input of each instance's members
    SELECT run_id, instance, max(bytes) AS bytes FROM collectives GROUP BY run_id, instance
),
sized AS (
    SELECT i.run_id, i.instance, i.op, i.dim, i.pg, i.ranks_seen, i.ranks, i.first_start_ns AS start_ns,
           i.last_start_ns, i.last_end_ns - i.last_start_ns AS time_ns,
           CASE WHEN i.op IN ('Send', 'Recv', 'Recv/Send') THEN 2 ELSE len(g.ranks) END AS n,
           g.ranks IS NOT NULL AS grouped, l.bytes
    FROM collective_instances i
    LEFT JOIN process_groups g ON g.run_id = i.run_id AND g.pg = i.pg
    LEFT JOIN largest l ON l.run_id = i.run_id AND l.instance = i.instance
),
factored AS (
    SELECT *, CASE WHEN op = 'AllGather' THEN n * bytes ELSE bytes END AS size_bytes,
           CASE WHEN op = 'AllReduce' THEN 2.0 * (n - 1) / n
                WHEN op IN ('AllGather', 'ReduceScatter', 'AllToAll') THEN (n - 1)::DOUBLE / n
                WHEN op IN ('Broadcast', 'Reduce', 'Send', 'Recv', 'Recv/Send', 'SendRecv') THEN 1.0 END AS factor
    FROM sized
),
-- the hosts of the members: a process group's ranks once per group (not once per instance: a data-parallel group
-- of 256 ranks runs hundreds of instances), else the instance's own traced ranks
group_hosts AS (
    SELECT g.run_id, g.pg, count(DISTINCT k.host)::INTEGER AS hosts, bool_and(k.host IS NOT NULL) AS known
    FROM process_groups g, unnest(g.ranks) AS m(rank)
    LEFT JOIN ranks k ON k.run_id = g.run_id AND k.rank = m.rank
    GROUP BY g.run_id, g.pg
),
instance_hosts AS (
    SELECT f.run_id, f.instance, count(DISTINCT k.host)::INTEGER AS hosts, bool_and(k.host IS NOT NULL) AS known
    FROM factored f, unnest(f.ranks) AS m(rank)
    LEFT JOIN ranks k ON k.run_id = f.run_id AND k.rank = m.rank
    WHERE NOT f.grouped
    GROUP BY f.run_id, f.instance
)
SELECT f.run_id, f.instance, f.op, f.dim, f.pg, f.n, f.ranks_seen, f.ranks, f.bytes, f.size_bytes, f.start_ns,
       f.last_start_ns, f.time_ns,
       f.size_bytes / nullif(f.time_ns, 0) AS algbw_GBps,
       f.size_bytes / nullif(f.time_ns, 0) * f.factor AS busbw_GBps,
       CASE WHEN coalesce(gh.known, ih.known) THEN coalesce(gh.hosts, ih.hosts) END AS hosts,
       CASE WHEN NOT coalesce(gh.known, ih.known) THEN NULL WHEN coalesce(gh.hosts, ih.hosts) = 1 THEN 'intra-node'
            ELSE 'inter-node' END AS link
FROM factored f
LEFT JOIN group_hosts gh ON f.grouped AND gh.run_id = f.run_id AND gh.pg = f.pg
LEFT JOIN instance_hosts ih ON ih.run_id = f.run_id AND ih.instance = f.instance;
