"""The estimate: per-chunk costs from compute and communication, a simulated pipeline, per-stage time by
dimension and memory by component.

The time columns mean what DESIGN §4 measures, per pipeline stage over one step:
COMP (compute, incl. recompute and the optimizer step), MP_WAIT / CP_WAIT / EP_WAIT (the exposed part of TP, CP and
EP communication, serial inside the forward and backward passes), DP_WAIT (exposed gradient / parameter traffic: the
reduction the last micro-batch's backward cannot hide, and ZeRO-3 gathers that prefetch cannot), IDLE (host time
no kernel covers: host-bound layers and calibration.step_overhead_ms) and PP_WAIT (bubble, exposed p2p, and waiting
for other stages' data parallel tails). TOTAL is the step time, the same for every stage, and equals the sum of the
other columns exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import polars as pl

from traceana.estimator import balance, comm, compute, hardware, memory, pipeline, stages
from traceana.estimator.comm import Pass
from traceana.estimator.config import Config, at_load

DIMENSIONS = ("comp", "mp_wait", "cp_wait", "ep_wait", "dp_wait", "pp_wait", "idle")


@dataclass(frozen=True)
class ChunkCost:
    """One micro-batch through one model chunk on one GPU, seconds, by what it is (communication = exposed part;
    a fully recomputed layer's forward communication runs again in its backward)."""

    forward: float = 0.0
    backward: float = 0.0
    wgrad: float = 0.0
    recompute: float = 0.0
    tp: Pass = field(default_factory=Pass)
    cp: Pass = field(default_factory=Pass)
    ep: Pass = field(default_factory=Pass)
    dp: Pass = field(default_factory=Pass)
    idle: Pass = field(default_factory=Pass)  # the device waiting for the host to issue work (host-bound layers)

    def __add__(self, o: ChunkCost) -> ChunkCost:
        return ChunkCost(self.forward + o.forward, self.backward + o.backward, self.wgrad + o.wgrad,
                         self.recompute + o.recompute, self.tp + o.tp, self.cp + o.cp, self.ep + o.ep, self.dp + o.dp,
                         self.idle + o.idle)

    def __mul__(self, k: float) -> ChunkCost:
        return ChunkCost(self.forward * k, self.backward * k, self.wgrad * k, self.recompute * k, self.tp * k,
                         self.cp * k, self.ep * k, self.dp * k, self.idle * k)

    @property
    def compute(self) -> float:
        return self.forward + self.backward + self.wgrad + self.recompute

    def stage_cost(self) -> pipeline.StageCost:
        comm_f = self.tp.forward + self.cp.forward + self.ep.forward + self.dp.forward + self.idle.forward
        comm_b = self.tp.backward + self.cp.backward + self.ep.backward + self.dp.backward + self.idle.backward
        return pipeline.StageCost(self.forward + comm_f, self.backward + self.recompute + comm_b, self.wgrad,
                                  self.ep.forward + self.ep.backward)


def _exposed_ep(cfg: Config, shared_flops: float) -> Pass:
    """A MoE layer's all-to-alls less what the shared experts hide: the dispatch runs beside the shared experts'
    forward, and the backward's beside their gradient (seed 001 CH 7.7); the rest is exposed (gate → dispatch →
    experts → combine is a dependency chain), then calibration.overlap.ep hides a further fraction."""
    raw = comm.ep_layer(cfg)
    shared_f = compute.seconds(shared_flops, cfg)
    hidden_f = min(raw.forward / 2, shared_f)
    hidden_b = min(raw.backward / 2, 2 * shared_f)
    return Pass(raw.forward - hidden_f, raw.backward - hidden_b) * (1 - cfg.calibration.overlap.of("ep"))


def _tp_blocks(cfg: Config, index: int, moe: bool) -> list[tuple[compute.Gemm, compute.Gemm]]:
    """Each tensor-parallel block's (column-parallel first, row-parallel last) product: attention's, and the MLP's
    where the layer is dense (a MoE block's expert products are not overlapped)."""
    gemms = compute.layer_gemms(cfg, index)
    blocks = [("attention", "mla_up_proj")] if cfg.model.attention else []
    if not moe:
        blocks.append(("mlp",))
    pairs = []
    for groups in blocks:
        mine = [g for g in gemms if g.group in groups]
        pairs.append((mine[0], mine[-1]))
    return pairs


def _exposed_tp(cfg: Config, index: int, moe: bool) -> Pass:
    """A layer's tensor-parallel communication left exposed. calibration.overlap.tp, when given, hides that
    fraction. Else, with parallel.tp_comm_overlap, each block's sequence-parallel all-gather runs in tp chunks
    beside the column-parallel matmul it feeds and its reduce-scatter beside the row-parallel matmul it drains
    (forward; the input-gradient matmuls backward), so a collective of c seconds beside a matmul of g leaves
    max(c / tp, c - g): the first chunk, or what the matmul cannot cover (Wang et al. 2023, "Overlap
    communication with dependent computation via decomposition"; Megatron-Core / Transformer Engine userbuffers).
    A MoE block's expert-TP reduction is not overlapped."""
    raw = comm.tp_layer(cfg, moe)
    if cfg.calibration.overlap.tp is not None or not cfg.parallel.tp_comm_overlap:
        return raw * (1 - cfg.calibration.overlap.of("tp"))
    tp = cfg.parallel.tp
    half = comm.tp_layer(cfg, False).forward / (2 * (1 + cfg.model.attention))  # one AG or RS of one block
    exposed = Pass()
    for block in _tp_blocks(cfg, index, moe):
        first, last = compute.gemm_times(list(block), cfg)
        exposed = exposed + Pass(max(half / tp, half - first.forward) + max(half / tp, half - last.forward),
                                 max(half / tp, half - last.backward) + max(half / tp, half - first.backward))
    if moe:
        expert = comm.tp_layer(cfg, True)
        exposed = exposed + Pass(expert.forward - 2 * half * cfg.model.attention,
                                 expert.backward - 2 * half * cfg.model.attention)
    return exposed


TE_OVERLAP_SMS = 16  # Transformer Engine's userbuffers: SMs a "pipeline" or "bulk" overlap takes from the GEMM


def _tp_overlap_compute(cfg: Config, index: int, moe: bool) -> compute.Work:
    """What parallel.tp_comm_overlap costs the matmuls it hides communication behind, as Transformer Engine's
    default userbuffer configuration runs them (transformer_engine/pytorch/module/base.py, get_default_config):
    the all-gathers go by ring exchange on the copy engines, which splits the column-parallel forward and the
    row-parallel input gradient into tp products of 1/tp of the rows (each less efficient, by their shapes); the
    row-parallel forward's reduce-scatter ("pipeline") and the column-parallel backward's ("bulk", input and weight
    gradient) keep 16 SMs for themselves, so those matmuls run on sms - 16 of the profile's SMs. Nothing without a
    hardware profile (no SM count), with calibration.overlap.tp, or for a MoE block's expert matmuls."""
    p, profile = cfg.parallel, cfg.profile
    if profile is None or cfg.calibration.overlap.tp is not None or not p.tp_comm_overlap:
        return compute.Work(0.0, 0.0, 0.0)
    tp, margin = p.tp, profile.sms / (profile.sms - TE_OVERLAP_SMS) - 1
    extra = compute.Work(0.0, 0.0, 0.0)
    for first, last in _tp_blocks(cfg, index, moe):
        whole_first, whole_last = compute.gemm_times([first, last], cfg)
        split_first, split_last = compute.gemm_times(
            [dataclasses.replace(g, m=g.m / tp, count=g.count * tp) for g in (first, last)], cfg)
        extra = extra + compute.Work(split_first.forward - whole_first.forward + margin * whole_last.forward,
                                     split_last.backward - whole_last.backward + margin * whole_first.backward,
                                     margin * whole_first.wgrad)
    return extra


def _skewed(cfg: Config, index: int) -> tuple[compute.Work, Pass]:
    """Dropless routing (model.expert_load): (the layer's compute, the mean over EP ranks of each rank's own at its
    load; the EP wait for the most loaded rank). Its slowest rank's forward paces the combine's all-to-all and its
    backward the backward's, so every other rank waits the difference there: the stage's mean COMP is its ranks'
    own work and its time the most loaded rank's."""
    ranks = [compute.layer_seconds(at_load(cfg, load), index) for load in cfg.model.expert_load or ()]
    mean = sum(ranks[1:], ranks[0]) * (1 / len(ranks))
    backward = [r.backward + r.wgrad + r.recompute for r in ranks]
    return mean, Pass(max(r.forward for r in ranks) - mean.forward,
                      max(backward) - mean.backward - mean.wgrad - mean.recompute)


def layer_cost(cfg: Config, index: int) -> ChunkCost:
    """One layer's cost for one micro-batch."""
    moe = cfg.model.is_moe(index)
    skewed = moe and cfg.model.expert_load is not None
    work, skew = _skewed(cfg, index) if skewed else (compute.layer_seconds(cfg, index), Pass())
    work = work + _tp_overlap_compute(cfg, index, moe)
    sec = [work.forward, work.backward, work.wgrad, work.recompute]
    tp = _exposed_tp(cfg, index, moe)
    cp = comm.cp_layer(cfg) * (1 - cfg.calibration.overlap.of("cp"))
    ep = _exposed_ep(cfg, compute.moe_parts(cfg)[1]) if moe else Pass()
    if cfg.schedule.recompute.kind_of(index) == "full":
        tp, cp, ep = (Pass(x.forward, x.backward + x.forward) for x in (tp, cp, ep))
    ep = ep + skew
    params = memory.layer_params(cfg, index)
    zero3 = comm.zero3_layer(cfg, params.dense + params.expert)  # prefetched behind the layer's own compute
    dp = Pass(max(0.0, zero3.forward - sec[0]), max(0.0, zero3.backward - sec[1] - sec[2]))
    gaps = cfg.calibration.idle_us_per_layer * 1e-6  # a third forward, two thirds backward, as their kernels go
    cost = ChunkCost(*sec, tp=tp, cp=cp, ep=ep, dp=dp, idle=Pass(gaps / 3, 2 * gaps / 3))
    if cfg.calibration.host_overlap == "pass":
        return cost + ChunkCost(idle=_host_wait(host_seconds(cfg, index), cost, per_pass=True))
    return cost


def host_seconds(cfg: Config, index: int) -> Pass:
    """Host time to issue one layer's forward and backward for one micro-batch: calibration.host_us_per_layer for
    the forward and host_us_per_backward_layer for the backward (default twice the forward; a hardware profile
    gives measured ones), a forward more for a full recompute, plus host_us_per_collective for each TP / EP
    collective call each way. Never less than launching the pass's kernels (compute.layer_kernels) at
    calibration.launch_us each: a config that says nothing of its host still pays for its launches."""
    cal, p = cfg.calibration, cfg.parallel
    calls = 2 * (p.tp > 1) + 2 * (p.ep > 1 and cfg.model.is_moe(index))
    kernels = compute.layer_kernels(cfg, index)
    forward = max(cal.host_us_per_layer, kernels[0] * cal.launch_us) + calls * cal.host_us_per_collective
    backward = max(2 * cal.host_us_per_layer if cal.host_us_per_backward_layer is None
                   else cal.host_us_per_backward_layer, kernels[1] * cal.launch_us) + calls * cal.host_us_per_collective
    again = forward if cfg.schedule.recompute.kind_of(index) == "full" else 0.0
    return Pass(forward * 1e-6, (backward + again) * 1e-6)


def _host_wait(host: Pass, cost: ChunkCost, per_pass: bool) -> Pass:
    """How long the device starves while the host issues work: PyTorch launches kernels asynchronously, so a
    stretch of work with no synchronization inside takes the longer of the host's and the device's time, not their
    sum. calibration.host_overlap says what a stretch is: a chunk's forward and backward of one micro-batch (plain
    eager PyTorch: nothing waits between them; the wait shows up in the backward, where autograd's host time
    dominates, ../shared/hardware/h200/launch.csv: 220 us forward, ~1250 backward), or each layer's forward and
    backward pass on their own (a framework that synchronizes between passes)."""
    device_f = cost.forward + cost.tp.forward + cost.cp.forward + cost.ep.forward + cost.dp.forward + cost.idle.forward
    device_b = (cost.backward + cost.wgrad + cost.recompute + cost.tp.backward + cost.cp.backward + cost.ep.backward
                + cost.dp.backward + cost.idle.backward)  # the device's own dead time passes while the host issues
    if per_pass:
        return Pass(max(0.0, host.forward - device_f), max(0.0, host.backward - device_b))
    return Pass(0.0, max(0.0, host.forward + host.backward - device_f - device_b))


def chunk_costs(cfg: Config, chunks: list[range]) -> list[ChunkCost]:
    """Per model chunk (model order): its layers, the embedding on the first, the output layer on the last."""
    kinds: dict[int, ChunkCost] = {}
    result, host = [], []
    for layers in chunks:
        total, issue = ChunkCost(), Pass()
        for i, n in memory.layer_kinds(cfg, layers).items():
            if i not in kinds:
                kinds[i] = layer_cost(cfg, i)
            total = total + kinds[i] * n
            issue = issue + host_seconds(cfg, i) * n
        if cfg.parallel.zero == 3 and layers:  # the chunk's first gather has nothing to hide behind
            first = memory.layer_params(cfg, layers[0])
            total = total + ChunkCost(dp=Pass(comm.zero3_layer(cfg, first.dense + first.expert).forward, 0.0))
        result.append(total)
        host.append(issue)
    head = compute.head_seconds(cfg)
    outside = Pass(0.0, cfg.calibration.host_us_per_micro_batch * 1e-6)  # the loss and the backward's start and end
    result = [cost + ChunkCost(wgrad=_accumulation(cfg, k, layers, len(chunks))) for k, (cost, layers) in
              enumerate(zip(result, chunks, strict=True))]
    embedding_tp, head_tp = comm.tp_embedding_head(cfg)
    overlap_tp = 1 - cfg.calibration.overlap.of("tp")
    result[0] = result[0] + ChunkCost(tp=embedding_tp * overlap_tp)
    result[-1] = result[-1] + ChunkCost(head.forward, head.backward, head.wgrad, tp=head_tp * overlap_tp)
    if cfg.calibration.host_overlap == "pass":  # layer_cost has the layers' waits; between passes nothing is queued
        return [cost + ChunkCost(idle=outside) for cost in result]
    return [cost + ChunkCost(idle=_host_wait(issue + outside, cost, per_pass=False))
            for cost, issue in zip(result, host, strict=True)]


def _accumulation(cfg: Config, k: int, layers: range, chunks: int) -> float:
    """A chunk's gradient accumulation, per micro-batch on average (every micro-batch but the first adds its
    gradients: compute.accumulation_seconds), with the embedding on the first chunk and the output layer on the
    last (once when they are tied on one device)."""
    m = cfg.micro_batches
    if m == 1 or cfg.model.gradient_accumulation_fusion:
        return 0.0
    held = sum(((memory.layer_params(cfg, i) * n) for i, n in memory.layer_kinds(cfg, layers).items()),
               memory.Params())
    edges = (k == 0) + (k == chunks - 1 and not (cfg.model.tied_embeddings and chunks == 1))
    params = held.dense + held.expert + edges * memory.embedding_params(cfg)
    largest = cfg.model.hidden * max(cfg.model.ffn_hidden, cfg.model.expert_ffn) / cfg.parallel.tp
    return compute.accumulation_seconds(cfg, params, largest) * (m - 1) / m


def _device_shares(cfg: Config, chunk: int) -> list[tuple[int, float]]:
    """Which devices run a model chunk, and for what share of the micro-batches (DualPipe: both directions)."""
    pp = cfg.parallel.pp
    if cfg.schedule.kind == "dualpipe":
        return [(chunk, 0.5), (pp - 1 - chunk, 0.5)]
    return [(stages.device_of_chunk(cfg, chunk), 1.0)]


def _optimizer_seconds(cfg: Config, states: memory.StageMemory) -> float:
    """Adam reads the gradient and reads and writes its state, memory-bound. With an fp32 master copy in that
    state (optimizer_bytes above the two moments at the weights' width: Megatron's 12) it then writes the bf16
    weight; without one (PyTorch's AdamW on bf16 weights: two bf16 moments, 4 bytes) it reads and writes the weight
    itself: 14 bytes a parameter, as torch._fused_adamw_'s four tensor lists (weights, gradients, moments) are.
    Without state (optimizer_bytes 0: plain SGD) it updates every weight the device holds from its gradient."""
    hbm = cfg.hardware.hbm_bandwidth_gb_per_s
    if hbm is None:
        return 0.0
    prec = cfg.precision
    updated = states.optimizer / prec.optimizer_bytes if prec.optimizer_bytes else states.params / prec.param_bytes
    weights = 1 if prec.optimizer_bytes > 2 * prec.param_bytes else 2  # written; read too without a master copy
    touched = updated * (2 * prec.optimizer_bytes + prec.grad_bytes + weights * prec.param_bytes)
    cal = cfg.calibration
    return touched / (hbm * 1e9 * hardware.optimizer_efficiency(cfg.profile, updated, cal.optimizer_efficiency
                                                                or cal.memory_efficiency))


MEGATRON_BUCKET_PARAMS = 40e6  # Megatron-Core DistributedDataParallelConfig: buckets of max(40M, 1M x dp) parameters


def _exposed_tail(cfg: Config, total: float, window: float, params: float) -> float:
    """Once-a-step DP traffic of ``params`` parameters beside the last micro-batch's pass of ``window`` seconds.
    calibration.overlap.dp, when given, hides that fraction (no more than the pass). Else with
    parallel.overlap_grad_reduce the traffic goes in buckets as the pass produces (or consumes) them, so what stays
    exposed is the last bucket, or what does not fit in the pass; without it, seed 001's default fraction."""
    if cfg.calibration.overlap.dp is None and cfg.parallel.overlap_grad_reduce:
        bucket = max(MEGATRON_BUCKET_PARAMS, 1e6 * cfg.parallel.dp)
        return max(total * min(1.0, bucket / params) if params else total, total - window)
    return max((1 - cfg.calibration.overlap.of("dp")) * total, total - window)


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline stage (device) over one step: seconds by dimension, memory by component."""

    stage: int
    layers: int
    comp: float
    mp_wait: float
    cp_wait: float
    ep_wait: float
    dp_wait: float
    pp_wait: float
    idle: float
    total: float
    memory: memory.StageMemory
    memory_limit: float

    @property
    def fits(self) -> bool:
        return self.memory.peak <= self.memory_limit


@dataclass(frozen=True)
class Estimate:
    config: Config
    chunks: list[range]
    costs: list[ChunkCost]          # per model chunk, model order
    stages: list[StageEstimate]
    pipeline: pipeline.PipelineResult
    p2p_s: float
    tails: list[float]              # per stage: exposed once-a-step DP traffic after its last pass, seconds
    optimizer: list[float]          # per stage: optimizer step, seconds

    @property
    def step_s(self) -> float:
        return self.stages[0].total

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def peak_memory(self) -> float:
        return max(s.memory.peak for s in self.stages)

    @cached_property
    def time_frame(self) -> pl.DataFrame:
        """Per stage, ms by dimension (DESIGN §4 column meanings)."""
        return pl.DataFrame({
            "stage": [s.stage for s in self.stages],
            "layers": [s.layers for s in self.stages],
            **{f"{d}_ms": [getattr(s, d) * 1e3 for s in self.stages] for d in DIMENSIONS},
            "total_ms": [s.total * 1e3 for s in self.stages],
        })

    @cached_property
    def memory_frame(self) -> pl.DataFrame:
        """Per stage, GiB by component, the peak (allocated: torch.cuda.max_memory_allocated), what the caching
        allocator reserves (max_memory_reserved) and what the device uses (nvidia-smi: reserved, NCCL's buffers and
        the CUDA context), and the headroom the allocated peak leaves (negative: by how much it does not fit)."""
        parts = ("params", "grads", "optimizer", "activations", "comm_buffers", "overheads")
        reserved, used = zip(*memory.reserved_and_used(self.config, self.chunks, [s.memory.peak for s in self.stages]),
                             strict=True)
        return pl.DataFrame({
            "stage": [s.stage for s in self.stages],
            **{f"{p}_gib": [getattr(s.memory, p) / memory.GIB for s in self.stages] for p in parts},
            "peak_gib": [s.memory.peak / memory.GIB for s in self.stages],
            "reserved_gib": [r / memory.GIB for r in reserved],
            "used_gib": [u / memory.GIB for u in used],
            "headroom_gib": [(s.memory_limit - s.memory.peak) / memory.GIB for s in self.stages],
            "fits": [s.fits for s in self.stages],
        })


def _vpp(cfg: Config) -> int:
    return 2 if cfg.schedule.kind == "zb-v" else cfg.parallel.vpp


def model_flops(cfg: Config, causal_halved: bool = True, recompute: bool = False) -> float:
    """FLOPs of one step over all GPUs: the numerator of MFU. Papers differ in two ways, so both are choices:
    ``causal_halved`` counts the causal attention core at the half FlashAttention computes (else the whole s x s
    score matrix, as Megatron's and PaLM's 6N + 12·L·h·s formulas do); ``recompute`` adds the repeated forward work
    (hardware FLOPs, HFU) instead of counting each useful FLOP once (model FLOPs, MFU)."""
    p = cfg.parallel
    if cfg.model.expert_load:  # dropless routing: the loads average a balanced split, whose FLOPs are the useful ones
        cfg = at_load(cfg, 1.0)
    per_gpu = compute.Work(0.0, 0.0, 0.0)
    for i in range(cfg.model.layers):
        per_gpu = per_gpu + compute.layer(cfg, i)
        if not causal_halved and cfg.model.flash_attention:
            core = compute.attention(cfg)[1]  # the halved core: add the masked half back, forward and backward
            again = {"full": core, "selective": core}.get(cfg.schedule.recompute.kind_of(i), 0.0)
            per_gpu = per_gpu + compute.Work(core, 2 * core, 0.0, again)
    per_gpu = per_gpu + compute.head(cfg)
    flops = per_gpu.total if recompute else per_gpu.forward + per_gpu.backward + per_gpu.wgrad
    return flops * p.micro_batches * p.tp * p.cp * p.dp


def utilization(est: Estimate) -> dict[str, float]:
    """The step's FLOP utilization of the bf16 peak in the conventions papers use, each named by what it counts."""
    cfg = est.config
    capacity = est.step_s * cfg.parallel.world_size * cfg.hardware.peak_tflops_bf16 * 1e12
    return {
        "mfu_causal_attention_halved": model_flops(cfg) / capacity,
        "mfu_full_attention": model_flops(cfg, causal_halved=False) / capacity,
        "hfu_with_recompute_causal_attention_halved": model_flops(cfg, recompute=True) / capacity,
    }


def ppb(cfg: Config) -> balance.Partition:
    """Seed 003's PPB over this config: per-layer time (compute and exposed communication of one micro-batch) and
    memory (model states, activations per in-flight micro-batch), plus what only the first and last stage carry
    (a stage holding no layers: embedding, output layer, buffers and overheads), under hardware.hbm_gb."""
    p, layers = cfg.parallel, range(cfg.model.layers)
    kinds = {(cfg.model.is_moe(i), cfg.schedule.recompute.kind_of(i)): i for i in layers}
    cost = {key: layer_cost(cfg, i) for key, i in kinds.items()}
    static = {key: sum(memory.states(cfg, memory.layer_params(cfg, i))) for key, i in kinds.items()}
    activation = {key: memory.layer_activation_bytes(cfg, i) for key, i in kinds.items()}
    key = [(cfg.model.is_moe(i), cfg.schedule.recompute.kind_of(i)) for i in layers]
    depth = pipeline.in_flight(cfg.schedule.kind, p.pp, p.micro_batches)
    empty = [range(0)] * p.pp
    edges = [c.stage_cost() for c in chunk_costs(cfg, empty)]
    terms = balance.StageTerms(
        layer_activation=[activation[k] for k in key], in_flight=depth,
        stage_cost=[c.forward_s + c.backward_s + c.wgrad_s for c in edges],
        stage_memory=[s.peak for s in memory.stage_memory(cfg, empty, depth)])
    seconds = [cost[k].stage_cost() for k in key]
    return balance.balance([c.forward_s + c.backward_s + c.wgrad_s for c in seconds], [static[k] for k in key],
                           p.pp, cfg.hardware.hbm_gb * memory.GIB, terms)


def peak_memory(cfg: Config, per_device: list[int] | None = None) -> float:
    """The largest stage's peak bytes, without simulating the step (the search's first filter)."""
    depth = pipeline.in_flight(cfg.schedule.kind, cfg.parallel.pp, cfg.micro_batches, _vpp(cfg))
    return max(s.peak for s in memory.stage_memory(cfg, stages.chunk_layers(cfg, per_device), depth))


def lower_bound(cfg: Config, per_device: list[int] | None = None) -> float:
    """No step is shorter than its busiest stage's own passes (no bubble, p2p or DP tail; DualPipe may hide all EP
    under other chunks' compute): lets the search skip a simulation that cannot make its top list."""
    chunks = stages.chunk_layers(cfg, per_device)
    busy = [0.0] * cfg.parallel.pp
    for k, cost in enumerate(chunk_costs(cfg, chunks)):
        one = cost.stage_cost()
        hideable = one.ep_exposed_s if cfg.schedule.kind == "dualpipe" else 0.0
        for device, share in _device_shares(cfg, k):
            busy[device] += share * (one.forward_s + one.backward_s + one.wgrad_s - hideable)
    return cfg.micro_batches * max(busy)


def estimate(cfg: Config, per_device: list[int] | None = None) -> Estimate:
    """Estimate one step of ``cfg``; ``per_device`` overrides the layers per pipeline device (balancing)."""
    p, cal, kind = cfg.parallel, cfg.calibration, cfg.schedule.kind
    m = p.micro_batches
    if per_device is None and cfg.schedule.stage_layers == "ppb":
        per_device = list(ppb(cfg).stage_partition)
    chunks = stages.chunk_layers(cfg, per_device)
    costs = chunk_costs(cfg, chunks)
    order = pipeline.segment_cost_index(kind, p.pp, _vpp(cfg))
    stage_costs: list[pipeline.StageCost] = [pipeline.StageCost(0, 0, 0)] * len(order)
    for k, i in enumerate(order):
        stage_costs[i] = costs[k].stage_cost()
    p2p_s = comm.pp_p2p(cfg)
    result = pipeline.simulate(kind, stage_costs, m, p2p_s, _vpp(cfg), cal.ep_bubble_overlap_ratio,
                               cfg.schedule.blocking_p2p(cfg.hardware.collectives))
    mem = memory.stage_memory(cfg, chunks, result.in_flight)

    per_device = [ChunkCost()] * p.pp
    layer_count = [0] * p.pp
    for k, cost in enumerate(costs):
        for device, share in _device_shares(cfg, k):
            per_device[device] = per_device[device] + cost * share
            layer_count[device] += len(chunks[k])
    held = memory.device_params(cfg, chunks)
    tails, optimizer = [], []
    for device in range(p.pp):
        sync = comm.dp_step(cfg, held[device].dense, held[device].expert)
        one = per_device[device]
        window_b = one.backward + one.wgrad + one.recompute
        params = held[device].dense + held[device].expert
        tails.append(_exposed_tail(cfg, sync.reduce, window_b, params)
                     + _exposed_tail(cfg, sync.gather, one.forward, params))
        optimizer.append(_optimizer_seconds(cfg, mem[device]))
    idle = cal.step_overhead_ms * 1e-3
    host_waits = [max(0.0, cal.host_us_per_step * 1e-6 - o) for o in optimizer]  # the optimizer step's host time
    total = result.makespan_s + max(t + o + w for t, o, w in zip(tails, optimizer, host_waits, strict=True)) + idle
    limit = cfg.hardware.hbm_gb * memory.GIB
    rows = []
    for device in range(p.pp):
        one = per_device[device]
        comp = m * one.compute + optimizer[device]
        mp = m * (one.tp.forward + one.tp.backward)
        idle_i = m * (one.idle.forward + one.idle.backward) + idle + host_waits[device]
        cp = m * (one.cp.forward + one.cp.backward)
        ep = m * (one.ep.forward + one.ep.backward) - result.ep_overlapped_s[device]
        dp = m * (one.dp.forward + one.dp.backward) + tails[device]
        pp = total - comp - mp - cp - ep - dp - idle_i
        rows.append(StageEstimate(device, layer_count[device], comp, mp, cp, ep, dp, pp, idle_i, total, mem[device],
                                  limit))
    return Estimate(cfg, chunks, costs, rows, result, p2p_s, tails, optimizer)
