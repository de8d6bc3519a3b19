-- host_ranges: the host's ranges that ran on a known thread (annotations with a thread: Kineto CPU ops, user ranges
-- and nn.Module ranges, nsys NVTX ranges), each with its depth in its thread's tree, so an export can draw the tree
-- and cap it level by level. Ranges of one thread nest; the depth is how many of them are open at its start, itself
-- included: a sweep, +1 at each start, -1 at each end (at one time: ends first, then starts, the longer first, then
-- the ends of empty ranges, so that a range right after another is not its child; of two ranges with the same start
-- and end, the smaller op_id opens first, the caller, as PyTorch numbers it, then the name: the same tree every time).
-- Columns: run_id, rank, thread (BIGINT), start_ns, end_ns (BIGINT ns), name, kind, domain (VARCHAR, as
--   annotations), op_id (BIGINT: a Kineto CPU op's External id, event_ops.op_id of the kernels it launched; NULL
--   for other ranges), depth (INTEGER: 1 for a range no other range of its thread holds, 2 inside one, ...).
CREATE OR REPLACE VIEW host_ranges AS
WITH ranges AS (
    SELECT run_id, rank, thread, start_ns, end_ns, name, kind, domain,
           CASE WHEN kind = 'cpu_op' THEN TRY_CAST(args->>'op_id' AS BIGINT) END AS op_id,
           row_number() OVER () AS id
    FROM annotations
    WHERE thread IS NOT NULL AND end_ns >= start_ns
),
marks AS (
    SELECT run_id, rank, thread, unnest([start_ns, end_ns]) AS t,
           unnest([1, CASE WHEN end_ns > start_ns THEN 0 ELSE 2 END]) AS k, unnest([-end_ns, 0]) AS tie,
           unnest([1, -1]) AS delta, unnest([id, NULL]) AS id, unnest([op_id, NULL]) AS op_id,
           unnest([name, NULL]) AS name
    FROM ranges
),
depths AS (
    SELECT id, sum(delta) OVER (PARTITION BY run_id, rank, thread ORDER BY t, k, tie, op_id, name
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS depth
    FROM marks
)
SELECT r.run_id, r.rank, r.thread, r.start_ns, r.end_ns, r.name, r.kind, r.domain, r.op_id, d.depth::INTEGER AS depth
FROM ranges r JOIN depths d ON d.id = r.id;
