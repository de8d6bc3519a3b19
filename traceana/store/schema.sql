-- The store: one DuckDB file, many runs. Times are integer ns on one timeline per run; sizes in bytes.
CREATE TABLE IF NOT EXISTS runs (
    run_id        VARCHAR PRIMARY KEY,
    source_format VARCHAR NOT NULL,      -- nsys / kineto / ascend / rocprofv3
    sources       VARCHAR[] NOT NULL,    -- absolute paths of the input files or folders
    ingested_at   TIMESTAMP NOT NULL,
    world_size    INTEGER NOT NULL,
    layout        VARCHAR,               -- the --layout spec, normalized; NULL when none was given
    tool_version  VARCHAR,               -- profiler / export version as the trace states it
    rank_source   VARCHAR,               -- how ranks were decided (distributedInfo, env:RANK, file-name, device-order, ...)
    notes         VARCHAR[],             -- what the ingester noticed (missing tables, guessed values)
    device        VARCHAR,               -- the device model the trace names (Kineto deviceProperties: 'NVIDIA H200'); NULL when none
    traceana_version VARCHAR             -- the traceana that ingested the run (a bug report names it); NULL before 0.2
);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS device VARCHAR;  -- stores written before the column existed
ALTER TABLE runs ADD COLUMN IF NOT EXISTS traceana_version VARCHAR;
CREATE TABLE IF NOT EXISTS ranks (
    run_id          VARCHAR NOT NULL,
    rank            INTEGER NOT NULL,
    host            VARCHAR,
    device          INTEGER,
    pid             BIGINT,
    clock_offset_ns BIGINT NOT NULL DEFAULT 0,  -- added to this rank's raw timestamps to reach the run timeline
    tp INTEGER, cp INTEGER, ep INTEGER, dp INTEGER, pp INTEGER,  -- coordinates from the layout; NULL when unknown
    rank_source     VARCHAR,
    source          VARCHAR,                    -- the file or folder this rank came from
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS process_groups (
    run_id  VARCHAR NOT NULL,
    pg      VARCHAR NOT NULL,   -- the group's id within the run (trace's own id, or dim:index for layout groups)
    dim     VARCHAR NOT NULL,   -- TP, CP, EP, DP, PP, a combined group (DP-CP, EP-TP, DP-EP ...) or UNKNOWN
    ranks   INTEGER[] NOT NULL, -- global ranks, sorted
    name    VARCHAR,            -- the framework's own name ('tp', 'TENSOR_MODEL_PARALLEL_GROUP', HCCL communicator)
    source  VARCHAR NOT NULL,   -- what gave the members: trace, timing-match (across ranks), fingerprint (layout)
    streams VARCHAR,            -- where its collectives ran, 'rank:stream ...' (CUDA/Ascend stream, gloo thread)
    PRIMARY KEY (run_id, pg)
);
ALTER TABLE process_groups ADD COLUMN IF NOT EXISTS streams VARCHAR;  -- stores written before the column existed
CREATE TABLE IF NOT EXISTS device_events (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    event_id BIGINT NOT NULL,   -- unique per (run_id, rank)
    stream   BIGINT,            -- CUDA stream, Ascend stream, or CPU thread id for CPU-only runs
    start_ns BIGINT NOT NULL,
    end_ns   BIGINT NOT NULL,
    name     VARCHAR NOT NULL,
    category VARCHAR NOT NULL,  -- compute / comm / memcpy / memset / sync / other
    launch_ns BIGINT,           -- when the host's runtime call that launched it started; NULL when not recorded
    launch_thread BIGINT        -- the thread that made that call (nsys: the runtime record's tid, as annotations'
                                --   thread); NULL when not recorded
);
-- Databases written before launch_ns / launch_thread existed gain them (NULL) on their next write.
ALTER TABLE device_events ADD COLUMN IF NOT EXISTS launch_ns BIGINT;
ALTER TABLE device_events ADD COLUMN IF NOT EXISTS launch_thread BIGINT;
CREATE TABLE IF NOT EXISTS collectives (
    run_id    VARCHAR NOT NULL,
    rank      INTEGER NOT NULL,
    event_id  BIGINT NOT NULL,  -- -> device_events(run_id, rank, event_id)
    op        VARCHAR NOT NULL, -- AllReduce AllGather ReduceScatter AllToAll Broadcast Reduce Send Recv SendRecv Barrier
    kernel_op VARCHAR,          -- what the kernel / task name says
    bytes     BIGINT,           -- payload this rank sends or contributes
    dtype     VARCHAR,
    pg        VARCHAR,          -- -> process_groups(run_id, pg)
    dim       VARCHAR NOT NULL, -- as process_groups.dim
    seq       BIGINT,           -- the trace's own sequence number / comms id, when it has one
    instance  BIGINT,           -- same value on every rank that took part in one collective
    peer      INTEGER,          -- global peer rank for Send/Recv
    evidence  VARCHAR NOT NULL  -- pg-args, nvtx, cpu-op, op-only, comm-name, layout-match, stream, timing-match, fingerprint, name-rule
);
CREATE TABLE IF NOT EXISTS annotations (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns   BIGINT NOT NULL,
    name     VARCHAR NOT NULL,
    domain   VARCHAR,           -- NVTX domain, Ascend track, 'cpu'
    kind     VARCHAR NOT NULL,  -- nvtx / cpu_op / user_annotation / python_function (nn.Module) / hccl_task / ...
    args     VARCHAR,           -- JSON text of extra fields (src/dst rank, link type, size, bandwidth; a Kineto CPU
                                --   op's op_id: event_ops.op_id of the kernels it launched ...)
    thread   BIGINT             -- the host thread it ran on (Kineto tid, nsys thread id), where ranges nest; NULL
                                --   where the trace does not say, and for ranges on a device stream
);
ALTER TABLE annotations ADD COLUMN IF NOT EXISTS thread BIGINT;  -- stores written before the column existed
CREATE TABLE IF NOT EXISTS steps (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    step     INTEGER NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns   BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);
CREATE TABLE IF NOT EXISTS memory (
    run_id          VARCHAR NOT NULL,
    rank            INTEGER NOT NULL,
    ts_ns           BIGINT NOT NULL,
    allocated_bytes BIGINT,
    reserved_bytes  BIGINT
);
CREATE TABLE IF NOT EXISTS syncs (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    kind     VARCHAR NOT NULL,  -- host_wait: the host blocked until device work ended (stream / event / device
                                --   synchronize, a blocking memcpy); stream_wait: a stream waited on the device for
                                --   work recorded on another stream (event record + stream wait)
    name     VARCHAR NOT NULL,  -- as the trace names it: cudaStreamSynchronize, Wait on Stream, STREAM_WAIT_EVENT, EVENT_WAIT ...
    start_ns BIGINT NOT NULL,   -- host_wait: the blocking call's start (host); stream_wait: when the wait was issued or ran
    end_ns   BIGINT NOT NULL,   -- host_wait: when the call returned; stream_wait: the wait's end (= start when instantaneous)
    waited_event_id BIGINT,     -- -> device_events.event_id (same run, rank): the last device event the wait covers; NULL when unresolved
    waiter_event_id BIGINT      -- -> device_events.event_id: stream_wait only, the first event on the waiting stream after the wait
);
CREATE TABLE IF NOT EXISTS event_ops (
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    event_id BIGINT NOT NULL,   -- -> device_events(run_id, rank, event_id)
    op_id    BIGINT NOT NULL,   -- the launching CPU op's id in the trace (Kineto External id): the events of one call share it
    op       VARCHAR NOT NULL,  -- the CPU op that launched the event (aten::mm, aten::_cudnn_attention_forward ...)
    input_dims  VARCHAR,        -- JSON: the op's input shapes as recorded (Kineto Input Dims, record_shapes=True), NULL when not
    input_types VARCHAR,        -- JSON: the inputs' types (c10::BFloat16, float, Scalar, TensorList ...)
    concrete_inputs VARCHAR     -- JSON: the scalar arguments' values as text (is_causal 'True', a dim '[0]'), '' for tensors
);
CREATE TABLE IF NOT EXISTS event_scopes (  -- stores written before it lack it: `traceana ops` asks to ingest again
    run_id   VARCHAR NOT NULL,
    rank     INTEGER NOT NULL,
    event_id BIGINT NOT NULL,   -- -> device_events(run_id, rank, event_id); events launched inside no range have no row
    op       VARCHAR,           -- Kineto: the outermost CPU op open on the launching thread at launch (aten::linear,
                                --   autograd::engine::evaluate_function: MmBackward0, Optimizer.step#AdamW.step)
    module   VARCHAR,           -- Kineto: the nn.Module path open at launch, outermost first ('GPT_0 / Block_3 / MLP_3')
    nvtx     VARCHAR,           -- nsys: the NVTX ranges open on the launching thread at launch, outermost first
                                --   (a range of a named domain as 'domain:name')
    phase    VARCHAR            -- 'backward' when launched under autograd's engine; NULL when the trace does not say
);
