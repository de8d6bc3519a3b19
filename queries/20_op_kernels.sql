-- op_kernels: each call of a CPU op that launched compute kernels (event_ops: the op a kernel's Kineto External id
-- names), with the shapes it was called with and the kernels' time: what the roofline models
-- (traceana/analyses/roofline.py). Every launch counts, inside a step window or not: each is a sample of its rate.
-- Columns: run_id, rank, op_id (BIGINT: the call, unique per rank), op (VARCHAR: aten::mm ...), input_dims,
--   input_types, concrete_inputs (VARCHAR: JSON as event_ops holds them; NULL when the trace recorded no shapes),
--   kernel (VARCHAR: the short name, kernel_names, of its longest kernel), launched (INTEGER: its kernels),
--   kernel_ns (BIGINT ns: their durations summed; one call's kernels run one after another on its stream),
--   start_ns (BIGINT ns: its first kernel's start).
CREATE OR REPLACE VIEW op_kernels AS
SELECT o.run_id, o.rank, o.op_id, any_value(o.op) AS op, any_value(o.input_dims) AS input_dims,
       any_value(o.input_types) AS input_types, any_value(o.concrete_inputs) AS concrete_inputs,
       arg_max(n.short_name, e.end_ns - e.start_ns) AS kernel, count(*)::INTEGER AS launched,
       sum(e.end_ns - e.start_ns)::BIGINT AS kernel_ns, min(e.start_ns) AS start_ns
FROM event_ops o
JOIN device_events e ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.event_id
JOIN kernel_names n ON n.run_id = e.run_id AND n.name = e.name
WHERE e.category = 'compute'
GROUP BY o.run_id, o.rank, o.op_id;
