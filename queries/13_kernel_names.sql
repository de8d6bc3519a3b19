-- kernel_names: each distinct device event name of a run and its short name, so that versions of one kernel match
-- (across template arguments, argument lists, and runs): C++ template arguments <...> are cut (innermost first, as
-- often as they nest, up to 32 levels: one list_reduce, not a recursive CTE, which cost twice as much), then the
-- argument list from the first '(' on, then a leading 'void' or return type. '(anonymous namespace)::' is dropped
-- first; a CUTLASS wrapper cutlass::Kernel<X> / Kernel2<X> is named X, its only distinguishing part; an HCCL op
-- loses its group-hash and sequence suffix ('hcom_allReduce__586_0_1' -> 'hcom_allReduce'). Names without templates
-- or arguments (nvjet_..., aten::mm, Memcpy HtoD) keep their text up to a '(' ('Memcpy HtoD (Pinned -> Device)' ->
-- 'Memcpy HtoD').
-- Columns: run_id, name (VARCHAR: device_events.name), short_name (VARCHAR).
CREATE OR REPLACE VIEW kernel_names AS
WITH stripped AS (
    SELECT run_id, name,
           trim(regexp_replace(list_reduce(range(32), lambda s, i: CASE WHEN s LIKE '%<%'
                                                              THEN regexp_replace(s, '<[^<>]*>', '', 'g') ELSE s END,
                                           coalesce(nullif(regexp_extract(name, 'cutlass::Kernel2?<(\w+)>', 1), ''),
                                                    replace(name, '(anonymous namespace)::', ''))),
                               '\(.*$', '')) AS s
    FROM (SELECT DISTINCT run_id, name FROM device_events)
)
SELECT run_id, name,
       CASE WHEN s LIKE '% %' AND regexp_extract(s, '(\S+)$', 1) LIKE '%::%' THEN regexp_extract(s, '(\S+)$', 1)
            ELSE regexp_replace(regexp_replace(s, '^void\s+', ''), '^(hcom_[A-Za-z]+)_[_0-9]*$', '\1') END AS short_name
FROM stripped;
