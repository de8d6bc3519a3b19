-- op_time: event_time with where each event was launched from (event_scopes), the levels `traceana ops --by`
-- groups by (DESIGN §9). The rows of a rank-step still add up to its COMP and waits exactly; a level the event has
-- no value for is NULL (the "(none)" row of `ops`).
-- Columns: run_id, rank, step, event_id, then the levels (VARCHAR):
--   kernel  the event's short name (kernel_names);
--   op      Kineto: the outermost CPU op open on the launching thread at launch (event_scopes.op); Ascend: the
--           task's operator, the aclnn API its name starts with (aclnnMm_MatMulCommon_MatMulV2 -> aclnnMm), else
--           the name without its trailing numbers (trans_TransData_0 -> trans_TransData, hcom_allReduce__586_0
--           -> hcom_allReduce);
--   module  Kineto: the nn.Module path open at launch, outermost first;
--   nvtx    nsys: the NVTX ranges open on the launching thread at launch, outermost first;
--   layer   the outermost element of the module or NVTX path that names a layer: a stem without digits, a '.',
--           '_' or ' ' and an index (TransformerBlock_3, layers.3, 'FSDP::pre_forward (encoder.block.16.layer.1)'),
--           the stem carrying at least two indices in the run; the name up to that index (encoder.block.16);
--   phase   'backward' (launched under autograd's engine) or NULL;
-- and BIGINT ns as event_time: COMP_ns, MP_WAIT_ns, CP_WAIT_ns, EP_WAIT_ns, DP_WAIT_ns, PP_WAIT_ns, OTHER_WAIT_ns.
CREATE OR REPLACE VIEW op_time AS
WITH paths AS (
    SELECT DISTINCT run_id, coalesce(module, nvtx) AS path FROM event_scopes WHERE coalesce(module, nvtx) IS NOT NULL
),
elements AS MATERIALIZED (  -- each path's elements with their place (outermost 1), and the label, stem and index of
                           -- one that ends in a number (matched once: a filter on the match would match again)
    SELECT run_id, path, place, regexp_extract(part, '^((\D*?)[._ ](\d+))', ['label', 'stem', 'idx']) AS m
    FROM (SELECT run_id, path, unnest(string_split(path, ' / ')) AS part,
                 generate_subscripts(string_split(path, ' / '), 1) AS place FROM paths)
),
stems AS (  -- the stems that number several instances in a run: layers, not one-off modules (GPT_0); two
            -- distinct indices are a min and max that differ (one aggregate, not count(DISTINCT)'s two)
    SELECT run_id, m.stem FROM elements WHERE m.idx <> '' GROUP BY ALL HAVING min(m.idx) <> max(m.idx)
),
layers AS (  -- an element without an index has stem '' too: only those with one may name a layer
    SELECT p.run_id, p.path, arg_min(p.m.label, p.place) AS layer
    FROM elements p JOIN stems s ON s.run_id = p.run_id AND s.stem = p.m.stem
    WHERE p.m.idx <> ''
    GROUP BY ALL
)
SELECT t.run_id, t.rank, t.step, t.event_id, n.short_name AS kernel,
       coalesce(s.op, CASE WHEN r.source_format = 'ascend'
                           THEN coalesce(nullif(regexp_extract(e.name, '^(aclnn[A-Za-z0-9]+)', 1), ''),
                                         regexp_replace(e.name, '(_+\d+)+$', '')) END) AS op,
       s.module, s.nvtx, l.layer, s.phase,
       t.COMP_ns, t.MP_WAIT_ns, t.CP_WAIT_ns, t.EP_WAIT_ns, t.DP_WAIT_ns, t.PP_WAIT_ns, t.OTHER_WAIT_ns
FROM event_time t
JOIN device_events e ON e.run_id = t.run_id AND e.rank = t.rank AND e.event_id = t.event_id
JOIN runs r ON r.run_id = t.run_id
LEFT JOIN kernel_names n ON n.run_id = e.run_id AND n.name = e.name
LEFT JOIN event_scopes s ON s.run_id = t.run_id AND s.rank = t.rank AND s.event_id = t.event_id
LEFT JOIN layers l ON l.run_id = t.run_id AND l.path = coalesce(s.module, s.nvtx);
