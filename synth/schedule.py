"""The estimator's simulated step as every rank's device work: kernels and collectives on one true timeline.

A pipeline stage's step comes from :func:`traceana.estimator.timeline.frame`: its passes (forward, backward, weight
gradient, optimizer) with their exposed TP / CP / EP / DP communication, host-bound waits and bubbles. Each pass is
played as ``rounds`` alternations of compute kernels (about ``kernel_us`` long) and one collective per exposed
dimension, so per-dimension time is the estimator's. All ranks of a stage play the same template; what makes them
differ is drawn from a seeded RNG:

- jitter: each compute kernel's length is scaled by ``1 + jitter * N(0, 1)`` (clipped to [0.5, 2]); a collective's
  transfer time by one draw per group instance, the same on all members;
- a straggler rank or stage runs its compute ``slowdown`` times longer;
- a collective starts on each member when that member reaches it and ends on all of them at the last arrival plus
  the transfer time (the wait the stragglers view reads);
- an op that follows a gap in the template (a bubble or host-bound wait) starts at its planned time or when the
  rank is free, whichever is later; an op that follows another directly starts when that one ends.

Pipeline transfers (Send on the sender, Recv on the receiver, on their own stream) keep the planned times.
Stages meet only through steps: step k starts on every rank at ``k * period``, the period being the planned step
with room for the slowdown and jitter, so each stage can be generated on its own (memory: one stage at a time).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import polars as pl

from traceana.errors import TraceanaError
from traceana.estimator import config as estimator_config
from traceana.estimator.config import Config
from traceana.layout import Layout

DIMS = ("TP", "CP", "EP", "DP", "PP")
COMPUTE_KINDS = ("F", "B", "W", "OPT")

# code of a template op
COMPUTE, COLLECTIVE, SEND, RECV = 0, 1, 2, 3

# Kernel names as recent CUDA builds of PyTorch, cuBLAS, FlashAttention and NCCL 2.19+ spell them.
KERNELS = {
    "F": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
          "_kernel__5x_cublas",
          "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, "
          "false, true, false, false, true, true, false, false>(flash::Flash_fwd_params)",
          "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, "
          "float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
          "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
          "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
          "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl("
          "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
          "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"),
    "B": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off"
          "_kernel__5x_cublas",
          "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, "
          "2, false, false, cutlass::bfloat16_t>, false, true, false, false, true, true, false>("
          "flash::Flash_bwd_params)",
          "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>("
          "c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
          "c10::BFloat16*, int)"),
    "W": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
          "_kernel__5x_cublas",),
    "OPT": ("void multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, "
            "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, "
            "double*, double, double, double, double, double, double, double*, double*>("
            "at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
            "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, "
            "double, double, double, double*, double*)",),
}
CPU_OPS = {"F": ("aten::mm", "aten::_flash_attention_forward", "aten::native_layer_norm", "aten::gelu"),
           "B": ("aten::mm", "aten::_flash_attention_backward", "aten::native_layer_norm_backward"),
           "W": ("aten::mm",), "OPT": ("aten::_fused_adam_",)}


@dataclass(frozen=True)
class Collective:
    """How one kind of collective looks in each format."""

    op: str           # canonical op (store spelling)
    kernel: str       # NCCL kernel, demangled
    cpu_op: str       # PyTorch ProcessGroupNCCL profiling title
    coll_name: str    # record_param_comms "Collective name"
    hccl: str         # HCCL op name stem (hcom_allReduce_ ...)
    dtype: str        # Kineto dtype spelling


NCCL_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
COLLECTIVES = {
    "TP": Collective("AllReduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + NCCL_ARGS, "nccl:all_reduce",
                     "allreduce", "hcom_allReduce_", "BFloat16"),
    "CP": Collective("AllGather", "ncclDevKernel_AllGather_RING_LL" + NCCL_ARGS, "nccl:_all_gather_base",
                     "_allgather_base", "hcom_allGather_", "BFloat16"),
    "EP": Collective("AllToAll", "ncclDevKernel_SendRecv" + NCCL_ARGS, "nccl:all_to_all", "all_to_all",
                     "hcom_alltoall_", "BFloat16"),
    "DP": Collective("ReduceScatter", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL" + NCCL_ARGS,
                     "nccl:_reduce_scatter_base", "_reduce_scatter_base", "hcom_reduceScatter_", "Float"),
    "SEND": Collective("Send", "ncclDevKernel_SendRecv" + NCCL_ARGS, "nccl:send", "send", "hcom_send_", "BFloat16"),
    "RECV": Collective("Recv", "ncclDevKernel_SendRecv" + NCCL_ARGS, "nccl:recv", "recv", "hcom_receive_",
                       "BFloat16"),
}
# Megatron-Core's group_desc for each generated group kind, and HCCL's parallel_group_info group_name.
GROUP_DESC = {"TP": "TENSOR_MODEL_PARALLEL_GROUP", "CP": "CONTEXT_PARALLEL_GROUP", "EP": "EXPERT_MODEL_PARALLEL_GROUP",
              "DP": "DATA_PARALLEL_GROUP", "PP": "PIPELINE_MODEL_PARALLEL_GROUP"}
HCCL_GROUP = {"TP": "tp", "CP": "cp", "EP": "exp", "DP": "dp", "PP": "pp"}
COMPUTE_STREAM, COMM_STREAM, P2P_STREAM = 7, 20, 24


def stream_of(code: pl.Expr, dim: pl.Expr) -> pl.Expr:
    """The CUDA stream of an op: compute on one stream; each process group's collectives on a stream of their own
    (ProcessGroupNCCL keeps one stream per group and device: TP 20, CP 21, EP 22, DP 23); send/recv on 24."""
    return (pl.when(code == COMPUTE).then(COMPUTE_STREAM).when(code == COLLECTIVE).then(COMM_STREAM + dim)
            .otherwise(P2P_STREAM))


@dataclass(frozen=True)
class Options:
    ranks: int | None = None          # world size; scales dp (and the global batch, keeping the micro-batches)
    steps: int = 3
    seed: int = 0
    jitter: float = 0.03              # relative std of kernel lengths
    kernel_us: float = 200.0          # typical compute kernel length: sets the number of events
    rounds: int = 4                   # compute / communication alternations per pass
    ranks_per_host: int = 8
    host_skew_us: float = 2000.0      # host clock offsets drawn uniformly in [-skew, +skew] (host 0: 0)
    device_skew_us: float = 0.0       # per-device offsets within a host, uniformly in [-skew, +skew]
    straggler_rank: int | None = None
    straggler_stage: int | None = None
    slowdown: float = 1.3             # a straggler's compute-time factor
    step_gap_us: float = 300.0        # host time between steps that no kernel covers
    pg_metadata: str = "full"         # full: pg_config and PG args; args: PG args only; none: neither

    def __post_init__(self) -> None:
        if self.steps < 1 or self.rounds < 1 or self.ranks_per_host < 1:
            raise TraceanaError("--steps, --rounds and --ranks-per-host must be at least 1")
        if self.kernel_us <= 0 or not 0 <= self.jitter < 0.5 or self.slowdown < 1:
            raise TraceanaError("--kernel-us must be > 0, --jitter in [0, 0.5), --slowdown >= 1")
        if self.pg_metadata not in ("full", "args", "none"):
            raise TraceanaError(f"--pg-metadata {self.pg_metadata!r}: choose full, args or none")


@dataclass
class Template:
    """One stage's step as ops in issue order (main chain first, then pipeline transfers), times in ns."""

    code: np.ndarray      # COMPUTE / COLLECTIVE / SEND / RECV
    plan: np.ndarray      # planned start, relative to the step start
    dur: np.ndarray       # planned length
    chained: np.ndarray   # starts when the previous main-chain op ends
    dim: np.ndarray       # index into DIMS for collectives and transfers, -1 for compute
    name: np.ndarray      # index into Plan.names
    cpu_op: np.ndarray    # index into Plan.names: the CPU op that launches it
    nelems: np.ndarray
    peer_stage: np.ndarray  # transfers: the other stage


@dataclass
class RankTrace:
    """One rank's device work: a frame of ops in true time (see :func:`Plan.stage_traces`)."""

    rank: int
    stage: int
    host: str
    host_index: int
    device: int
    clock_offset_ns: int      # true -> this rank's clock: host offset + device offset
    ops: pl.DataFrame


@dataclass
class Plan:
    cfg: Config
    options: Options
    layout: Layout
    templates: list[Template]
    step_ns: int                # planned step length
    period_ns: int              # step k starts at k * period on every rank
    estimate_ms: pl.DataFrame   # the estimator's per-stage breakdown, for reference
    names: list[str] = field(default_factory=list)
    groups: dict[str, list[list[int]]] = field(default_factory=dict)
    host_offsets_ns: list[int] = field(default_factory=list)
    device_offsets_ns: list[int] = field(default_factory=list)
    slow: np.ndarray = field(default_factory=lambda: np.ones(0))

    @property
    def world(self) -> int:
        return self.layout.world_size

    @cached_property
    def coords(self) -> np.ndarray:
        """world x 5 array of tp, cp, ep, dp, pp coordinates."""
        return np.array([[c[d] for d in ("tp", "cp", "ep", "dp", "pp")] for c in map(self.layout.coords,
                                                                                   range(self.world))])

    def host_of(self, rank: int) -> int:
        return rank // self.options.ranks_per_host

    def stage_ranks(self, stage: int) -> np.ndarray:
        return np.flatnonzero(self.coords[:, 4] == stage) if self.layout.pp > 1 else np.arange(self.world)

    def process_groups(self) -> list[dict]:
        """Every group of size > 1: pg (torch numbering from 1; 0 is the world), dim, ranks."""
        out, index = [], 1
        for dim in DIMS:
            for ranks in self.groups.get(dim, []):
                if len(ranks) > 1:
                    out.append({"pg": str(index), "dim": dim, "desc": GROUP_DESC[dim], "ranks": ranks})
                    index += 1
        return out

    def stage_traces(self) -> Iterator[RankTrace]:
        """Every rank's ops, one stage at a time (rank order within a stage)."""
        groups = self.process_groups()
        for stage, template in enumerate(self.templates):
            yield from _simulate_stage(self, stage, template, groups)


def _with_ranks(cfg: Config, ranks: int | None) -> Config:
    """``cfg`` with dp scaled so that the world is ``ranks``, keeping the micro-batches per step."""
    p = cfg.parallel
    if ranks is None or ranks == p.world_size:
        return cfg
    per_replica = p.tp * p.cp * p.pp
    if ranks % per_replica:
        raise TraceanaError(f"--ranks {ranks}: not a multiple of tp*cp*pp = {per_replica} of {cfg.source}")
    dp = ranks // per_replica
    parallel = dataclasses.replace(p, dp=dp, global_batch=p.micro_batches * dp * p.micro_batch)
    scaled = dataclasses.replace(cfg, parallel=parallel)
    estimator_config.validate(scaled)
    return scaled


def build(cfg: Config, options: Options) -> Plan:
    """The plan: per-stage templates from the estimator, groups, clock offsets and the straggler."""
    from traceana.estimator import timeline
    from traceana.estimator.estimate import estimate

    cfg = _with_ranks(cfg, options.ranks)
    est = estimate(cfg)
    frame = timeline.frame(est).with_columns((pl.col("start_ms") * 1e6).round().cast(pl.Int64).alias("t0"),
                                             (pl.col("end_ms") * 1e6).round().cast(pl.Int64).alias("t1"))
    layout = cfg.parallel.layout
    step_ns = round(est.step_s * 1e9)
    names: dict[str, int] = {}
    templates = _templates(frame, cfg, options, names)
    slowdown = options.slowdown if options.straggler_rank is not None or options.straggler_stage is not None else 1
    period = math.ceil(step_ns * slowdown * (1 + 6 * options.jitter)) + round(options.step_gap_us * 1e3)
    plan = Plan(cfg, options, layout, templates, step_ns, period, est.time_frame, list(names),
                {d: layout.groups[d] for d in DIMS})
    world = layout.world_size
    if options.straggler_rank is not None and not 0 <= options.straggler_rank < world:
        raise TraceanaError(f"--straggler-rank {options.straggler_rank}: the world has ranks 0..{world - 1}")
    if options.straggler_stage is not None and not 0 <= options.straggler_stage < layout.pp:
        raise TraceanaError(f"--straggler-stage {options.straggler_stage}: stages are 0..{layout.pp - 1}")
    rng = np.random.default_rng([options.seed, 1])
    hosts = math.ceil(world / options.ranks_per_host)
    host = rng.uniform(-1, 1, hosts) * options.host_skew_us * 1e3
    host[0] = 0
    device = rng.uniform(-1, 1, world) * options.device_skew_us * 1e3
    plan.host_offsets_ns = [round(x) for x in host]
    plan.device_offsets_ns = [round(x) for x in device]
    slow = np.ones(world)
    if options.straggler_rank is not None:
        slow[options.straggler_rank] = options.slowdown
    if options.straggler_stage is not None:
        slow[plan.coords[:, 4] == options.straggler_stage] = options.slowdown
    plan.slow = slow
    return plan


def load(path: str, options: Options) -> Plan:
    return build(estimator_config.load(path), options)


def _templates(frame: pl.DataFrame, cfg: Config, options: Options, names: dict[str, int]) -> list[Template]:
    """Per stage, the frame's intervals as ops (see the module docstring)."""
    def intern(text: str) -> int:
        return names.setdefault(text, len(names))

    p = cfg.parallel
    activation = p.micro_batch * cfg.model.seq_len * cfg.model.hidden // max(p.cp, 1)
    nelems = {"TP": activation, "CP": activation, "EP": activation * max(cfg.model.moe_topk, 1), "DP": 1 << 24,
              "PP": activation}
    kernel_ns = options.kernel_us * 1e3
    rows = frame.filter(~pl.col("kind").is_in(["BUBBLE"]))
    transfers = _transfers(frame)
    templates = []
    for stage in range(p.pp):
        ops: list[tuple] = []  # code, plan, dur, dim, name, cpu_op, nelems, peer_stage
        main = rows.filter((pl.col("stage") == stage) & (pl.col("kind") != "P2P")).sort("t0")
        for piece in _passes(main.select("kind", "micro_batch", "t0", "t1").rows()):
            ops += _play_pass(piece, options.rounds, kernel_ns, nelems, intern)
        chain_end = np.array([o[1] + o[2] for o in ops])
        chained = np.zeros(len(ops), dtype=bool)
        if len(ops) > 1:
            chained[1:] = np.abs(np.array([o[1] for o in ops[1:]]) - chain_end[:-1]) < 1
        side = []
        for receiver, sender, t0, t1 in transfers:
            if stage in (receiver, sender):
                spec = COLLECTIVES["RECV" if stage == receiver else "SEND"]
                side.append((RECV if stage == receiver else SEND, t0, t1 - t0, DIMS.index("PP"),
                             intern(spec.kernel), intern(spec.cpu_op), nelems["PP"],
                             sender if stage == receiver else receiver))
        table = ops + side
        arrays = list(zip(*table, strict=True)) if table else [()] * 8
        templates.append(Template(
            code=np.array(arrays[0], dtype=np.int8), plan=np.array(arrays[1], dtype=np.int64),
            dur=np.array(arrays[2], dtype=np.int64), chained=np.concatenate([chained, np.zeros(len(side), bool)]),
            dim=np.array(arrays[3], dtype=np.int8), name=np.array(arrays[4], dtype=np.int32),
            cpu_op=np.array(arrays[5], dtype=np.int32), nelems=np.array(arrays[6], dtype=np.int64),
            peer_stage=np.array(arrays[7], dtype=np.int32)))
    return templates


def _transfers(frame: pl.DataFrame) -> list[tuple[int, int, int, int]]:
    """(receiver, sender, t0, t1) of each pipeline transfer: the sender is the stage whose pass of the same
    micro-batch ended when the transfer started."""
    p2p = frame.filter(pl.col("kind") == "P2P").select("stage", "micro_batch", "t0", "t1").rows()
    passes = frame.filter(~pl.col("kind").is_in(["P2P", "BUBBLE"]) & (pl.col("micro_batch") >= 0))
    ends = {(mb, t1): s for s, mb, t1 in passes.select("stage", "micro_batch", "t1").rows()}
    out = []
    for stage, mb, t0, t1 in p2p:
        sender = ends.get((mb, t0))
        if sender is None:  # rounding put the end one ns away
            sender = next((s for (m, t), s in ends.items() if m == mb and abs(t - t0) <= 2 and s != stage), None)
        if sender is not None and sender != stage:
            out.append((stage, sender, t0, t1))
    return out


def _passes(rows: list[tuple]) -> Iterator[list[tuple]]:
    """Group consecutive intervals into passes: a pass starts at compute (F/B/W/OPT), a once-a-step piece, or a
    gap; the exposed communication and host waits that directly follow belong to it."""
    current: list[tuple] = []
    for row in rows:
        kind, mb, t0, _ = row
        starts = kind in COMPUTE_KINDS or mb < 0 or not current or abs(t0 - current[-1][3]) > 1
        if starts and current and not (kind == "DP" and mb < 0 and current[-1][0] == "DP"):
            yield current
            current = []
        current.append(row)
    if current:
        yield current


def _play_pass(piece: list[tuple], rounds: int, kernel_ns: float, nelems: dict[str, int],
               intern: Callable[[str], int]) -> list[tuple]:
    """A pass as ``rounds`` x (compute kernels, one collective per exposed dim, host wait)."""
    t = piece[0][2]
    compute = [(k, t1 - t0) for k, _, t0, t1 in piece if k in COMPUTE_KINDS]
    comm = [(k, t1 - t0) for k, _, t0, t1 in piece if k in DIMS]
    idle = sum(t1 - t0 for k, _, t0, t1 in piece if k == "IDLE")
    n_rounds = rounds if compute and (comm or idle) else (rounds if comm else 1)
    ops = []
    for r in range(n_rounds):
        for kind, length in compute:
            share = _share(length, n_rounds, r)
            count = max(1, round(share / kernel_ns))
            names, cpu = KERNELS[kind], CPU_OPS[kind]
            for i in range(count):
                d = _share(share, count, i)
                ops.append((COMPUTE, t, d, -1, intern(names[i % len(names)]), intern(cpu[i % len(cpu)]), 0, -1))
                t += d
        for dim, length in comm:
            d = _share(length, n_rounds, r)
            spec = COLLECTIVES[dim]
            ops.append((COLLECTIVE, t, d, DIMS.index(dim), intern(spec.kernel), intern(spec.cpu_op), nelems[dim], -1))
            t += d
        t += _share(idle, n_rounds, r)
    return [o for o in ops if o[2] > 0]


def _share(total: int, parts: int, i: int) -> int:
    """The i-th of ``parts`` integer shares of ``total`` (they sum to it exactly)."""
    return total * (i + 1) // parts - total * i // parts


def _simulate_stage(plan: Plan, stage: int, tpl: Template, groups: list[dict]) -> Iterator[RankTrace]:
    """Play one stage's template for every step on all its ranks at once (arrays ranks x ops)."""
    options = plan.options
    ranks = plan.stage_ranks(stage)
    n, k = len(ranks), len(tpl.code)
    local = {int(r): i for i, r in enumerate(ranks)}
    # per dim: each stage rank's group (local index of its first member) and pg name
    leader = np.tile(np.arange(n), (len(DIMS), 1))
    pg_of = np.full((len(DIMS), n), -1)
    for g in groups:
        members = [local[r] for r in g["ranks"] if r in local]
        d = DIMS.index(g["dim"])
        pg_of[d, members] = int(g["pg"])
        if len(members) == len(g["ranks"]):  # every group but PP lies inside one stage
            leader[d, members] = members[0]
    rng = np.random.default_rng([options.seed, 2, stage])
    slow = plan.slow[ranks][:, None]
    main = np.flatnonzero(tpl.code <= COLLECTIVE)
    side = np.flatnonzero(tpl.code >= SEND)
    blocks = [i for i in main if tpl.code[i] == COLLECTIVE or not tpl.chained[i]]
    bounds = [*blocks, main[-1] + 1] if len(main) else [0]
    start = np.empty((n, options.steps, k), dtype=np.int64)
    end = np.empty((n, options.steps, k), dtype=np.int64)
    is_compute = tpl.code == COMPUTE
    for step in range(options.steps):
        t_step = step * plan.period_ns
        z = rng.standard_normal((n, k))
        for d in range(len(DIMS)):  # a collective's transfer time is drawn once per group instance
            cols = np.flatnonzero((tpl.dim == d) & ~is_compute)
            if cols.size:
                z[:, cols] = z[leader[d]][:, cols]
        dur = np.rint(tpl.dur * np.clip(1 + options.jitter * z, 0.5, 2.0)).astype(np.int64)
        dur[:, is_compute] = np.rint(dur[:, is_compute] * slow).astype(np.int64)
        free = np.full(n, t_step, dtype=np.int64)
        for i, j in itertools.pairwise(bounds):
            s0 = free if tpl.chained[i] else np.maximum(free, t_step + tpl.plan[i])
            if tpl.code[i] == COLLECTIVE:
                last = np.full(n, np.iinfo(np.int64).min)
                np.maximum.at(last, leader[tpl.dim[i]], s0)
                e0 = last[leader[tpl.dim[i]]] + dur[:, i]
            else:
                e0 = s0 + dur[:, i]
            start[:, step, i], end[:, step, i] = s0, e0
            if j > i + 1:
                ends = e0[:, None] + np.cumsum(dur[:, i + 1:j], axis=1)
                end[:, step, i + 1:j] = ends
                start[:, step, i + 1:j] = ends - dur[:, i + 1:j]
            free = end[:, step, j - 1]
        if (free > t_step + plan.period_ns).any():  # the period leaves 6 sigma of jitter: practically never
            raise TraceanaError(f"stage {stage}, step {step}: the work outran the step period; lower --jitter")
        start[:, step, side] = t_step + tpl.plan[side]
        end[:, step, side] = t_step + tpl.plan[side] + tpl.dur[side]
    coords = plan.coords
    rank_of = {(c[0], c[1], c[3], c[4]): r for r, c in enumerate(coords)}  # (tp, cp, dp, pp) -> rank
    stages = np.unique(tpl.peer_stage[tpl.peer_stage >= 0])
    for i, rank in enumerate(ranks):
        c = coords[rank]
        peer_of = np.full(plan.layout.pp + 1, -1)  # index -1 (no peer) reads the last entry
        peer_of[stages] = [rank_of[(c[0], c[1], c[3], s)] for s in stages]
        peer = peer_of[tpl.peer_stage]
        dim = tpl.dim.astype(np.int64)
        pg = np.where(dim >= 0, pg_of[np.clip(dim, 0, None), i], -1)
        ops = pl.DataFrame({
            "step": np.repeat(np.arange(options.steps, dtype=np.int32), k),
            "op": np.tile(np.arange(k, dtype=np.int32), options.steps),
            "code": np.tile(tpl.code, options.steps),
            "start_ns": start[i].ravel(), "end_ns": end[i].ravel(),
            "dim": np.tile(tpl.dim, options.steps), "name": np.tile(tpl.name, options.steps),
            "cpu_op": np.tile(tpl.cpu_op, options.steps), "nelems": np.tile(tpl.nelems, options.steps),
            "pg": np.tile(pg, options.steps).astype(np.int32), "peer": np.tile(peer, options.steps).astype(np.int32),
        }).sort("start_ns", "end_ns", "op")
        host = plan.host_of(int(rank))
        yield RankTrace(int(rank), stage, f"node{host:04d}", host, int(rank) % options.ranks_per_host,
                        plan.host_offsets_ns[host] + plan.device_offsets_ns[rank], ops)


def launch_times(ops: pl.DataFrame) -> pl.Series:
    """Host launch times: the main thread runs ahead of its stream, at least 5 µs before each kernel and 10 µs
    after its previous launch (a reverse running minimum); pipeline transfers launch 5 µs before they start, from
    their own thread. True time, in the order of ``ops``."""
    ops = ops.with_row_index("_i")
    main = ops.filter(pl.col("code") <= COLLECTIVE).sort("start_ns", "op")
    j = pl.int_range(pl.len(), dtype=pl.Int64)
    launch = main.select("_i", ((pl.col("start_ns") - 10_000 * j).reverse().cum_min().reverse() + 10_000 * j - 5_000)
                         .alias("launch_ns"))
    side = ops.filter(pl.col("code") > COLLECTIVE).select("_i", (pl.col("start_ns") - 5_000).alias("launch_ns"))
    return pl.concat([launch, side]).sort("_i")["launch_ns"]
