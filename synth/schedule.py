"""The estimator's simulated step as every rank's device work: kernels and collectives on one true timeline.

A pipeline stage's step comes from :func:`traceana.estimator.timeline.frame`: its passes (forward, backward, weight
gradient, optimizer) with their exposed TP / CP / EP / DP communication, host-bound waits and bubbles. Each pass is
played as ``rounds`` alternations of compute kernels (about ``kernel_us`` long) and one collective per exposed
dimension, so per-dimension time is the estimator's. All ranks of a stage play the same template; what makes them
differ is drawn from a seeded RNG:

- jitter: each compute kernel's length is scaled by ``1 + jitter * N(0, 1)`` (clipped to [0.5, 2]); a collective's
  transfer time by one draw per group instance, the same on all members;
- a straggler rank or stage runs its compute ``slowdown`` times longer;
- ``comm_scale`` makes one dim's transfers (collectives, or PP's sends and receives) take a factor longer, as a
  link of that bandwidth over the factor would: it scales the planned lengths, so the draws stay the same;
- a collective starts on each member when that member reaches it and ends on all of them at the last arrival plus
  the transfer time (the wait the stragglers view reads);
- an op that follows a gap in the template (a bubble or host-bound wait) starts at its planned time or when the
  rank is free, whichever is later; an op that follows another directly starts when that one ends. The planned
  times are the estimator's, before ``comm_scale``: a factor below 1 leaves them where they were, so such a run
  idles where a faster link would not (TP=0.5 on examples/synth_gpt_tp2pp2.yaml: stage 0's IDLE 0.25 -> 5.3 ms).

Stages are coupled through their pipeline transfers (a Send on the sender, a Recv on the receiver, on their own
stream): the Send starts when the pass it carries ends, the Recv when the receiver reaches the pass that needs it,
both end at the later start plus the planned transfer time, and that pass starts no earlier. So a slow stage delays
its neighbours, activations flowing down the pipeline and gradients up, as in a real 1F1B run. A step ends for
everyone with the last rank's work (the optimizer's sync); the next starts ``step_gap_us`` later, its planned times
counted from there. The coupling plays all stages together, one step at a time, keeping only step starts and
transfer times; each stage is then replayed on its own with the same draws (memory: one stage's ops at a time).

The host runs ahead of the device and blocks only at the step's end (:func:`host_launches`, :func:`device_syncs`):
from the step's planned start its main thread launches at a fixed pace (``HOST_PACE_NS``), each launch at least
``LAUNCH_LEAD_NS`` before its kernel, then calls ``cudaDeviceSynchronize``, which returns ``SYNC_RETURN_NS`` after
the rank's last device work; the next step's first launch follows the step gap. The device timeline does not depend
on the host: it is the same with any host rule that keeps launches ahead of their kernels.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

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
MAX_SKEW_US = 1e9  # a clock skew beyond 1000 s is no profiler's; past 2^63 ns the offsets overflowed

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
# The host (ns): the main thread issues one launch per HOST_PACE_NS, never later than LAUNCH_LEAD_NS before its
# kernel; a cudaLaunchKernel call takes LAUNCH_CALL_NS; cudaDeviceSynchronize returns SYNC_RETURN_NS after the
# device's last work; a ProfilerStep / NVTX step range opens STEP_OPEN_NS before the step's first launch.
HOST_PACE_NS, LAUNCH_LEAD_NS, LAUNCH_CALL_NS, SYNC_RETURN_NS, STEP_OPEN_NS = 10_000, 5_000, 2_000, 2_000, 10_000


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
    comm_scale: tuple[tuple[str, float], ...] = ()  # (dim, factor): that dim's transfers take factor x as long

    def __post_init__(self) -> None:
        if self.steps < 1 or self.rounds < 1 or self.ranks_per_host < 1:
            raise TraceanaError("--steps, --rounds and --ranks-per-host must be at least 1")
        if self.kernel_us <= 0 or not 0 <= self.jitter < 0.5 or self.slowdown < 1:
            raise TraceanaError("--kernel-us must be > 0, --jitter in [0, 0.5), --slowdown >= 1")
        if not (abs(self.host_skew_us) <= MAX_SKEW_US and abs(self.device_skew_us) <= MAX_SKEW_US):
            raise TraceanaError(f"--host-skew-us and --device-skew-us: at most ±{MAX_SKEW_US:g} µs (1000 s)")
        if self.pg_metadata not in ("full", "args", "none"):
            raise TraceanaError(f"--pg-metadata {self.pg_metadata!r}: choose full, args or none")
        # the last rank's sync returns, the next step's range opens and its first launch leads its kernel, in the gap
        least_gap = SYNC_RETURN_NS + STEP_OPEN_NS + LAUNCH_LEAD_NS
        if self.step_gap_us * 1e3 < least_gap:
            raise TraceanaError(f"step_gap_us {self.step_gap_us:g}: must be at least {least_gap / 1e3:g} µs (the "
                                "device sync's return, the next ProfilerStep's opening and its first launch)")
        for dim, factor in self.comm_scale:
            if dim not in DIMS or not factor > 0:
                raise TraceanaError(f"--comm-scale {dim}={factor:g}: a dim of {', '.join(DIMS)} and a factor > 0")


def comm_scale(specs: list[str]) -> tuple[tuple[str, float], ...]:
    """``["TP=2", "dp=1.5,pp=3"]`` -> ``(("TP", 2.0), ("DP", 1.5), ("PP", 3.0))``: --comm-scale's values."""
    out = []
    for spec in (s for text in specs for s in text.split(",") if s.strip()):
        dim, _, factor = spec.partition("=")
        try:
            out.append((dim.strip().upper(), float(factor)))
        except ValueError:
            raise TraceanaError(f"--comm-scale {spec!r}: write DIM=FACTOR, e.g. TP=2") from None
    return tuple(out)


@dataclass
class Template:
    """One stage's step as ops in issue order (main chain first, then pipeline transfers in planned order), times in
    ns."""

    code: np.ndarray      # COMPUTE / COLLECTIVE / SEND / RECV
    plan: np.ndarray      # planned start, relative to the step start
    dur: np.ndarray       # planned length
    chained: np.ndarray   # starts when the previous main-chain op ends
    dim: np.ndarray       # index into DIMS for collectives and transfers, -1 for compute
    name: np.ndarray      # index into Plan.names
    cpu_op: np.ndarray    # index into Plan.names: the CPU op that launches it
    nelems: np.ndarray
    peer_stage: np.ndarray  # transfers: the other stage
    link: np.ndarray        # a Send: the main op whose end issues it; a Recv: the main op that waits for it; or -1
    transfer: np.ndarray    # transfers: the pair's number (a Send and its Recv share it), -1 for main-chain ops


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
    step_starts_ns: np.ndarray  # each step's planned start, true time (the same on every rank)


@dataclass
class Plan:
    cfg: Config
    options: Options
    layout: Layout
    templates: list[Template]
    step_ns: int                # planned step length
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

    @cached_property
    def pipelines(self) -> np.ndarray:
        """pipelines x pp: each row one pipeline (PP group), its rank on every stage."""
        return np.array(self.groups["PP"])

    def peers(self, ranks: np.ndarray, stage: int) -> np.ndarray:
        """The rank on ``stage`` of each of ``ranks``' pipeline."""
        row = np.empty(self.world, dtype=np.int64)
        row[self.pipelines] = np.arange(len(self.pipelines))[:, None]
        return self.pipelines[row[ranks], stage]

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

    @cached_property
    def stages(self) -> list[_Stage]:
        """Each stage's ranks, ready to play its template."""
        groups = self.process_groups()
        return [_Stage(self, s, groups) for s in range(len(self.templates))]

    @cached_property
    def coupling(self) -> Coupling:
        """The stages played together, step by step (see :func:`_couple`)."""
        return _couple(self, self.stages)

    def stage_traces(self) -> Iterator[RankTrace]:
        """Every rank's ops, one stage at a time (rank order within a stage), each stage replayed on its own from
        the coupling (memory: one stage's ops at a time)."""
        for stage, transfers in zip(self.stages, self.coupling.transfers, strict=True):
            yield from _replay(self, stage, self.coupling.step_starts_ns, transfers)


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
    for dim, factor in options.comm_scale:  # planned lengths only: the draws, so the compute jitter, stay the same
        for tpl in templates:
            scaled = (tpl.code != COMPUTE) & (tpl.dim == DIMS.index(dim))
            tpl.dur[scaled] = np.rint(tpl.dur[scaled] * factor).astype(np.int64)
    plan = Plan(cfg, options, layout, templates, step_ns, est.time_frame, list(names),
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


def expected_ops(cfg: Config, options: Options) -> tuple[int, int]:
    """(device ops of the whole run, of the largest stage's ranks) the plan would write, from the estimator's
    timeline alone (no op is made): what `traceana synth` checks against memory and disk before it starts. A pass
    plays each compute interval as at least ``rounds`` kernels of about ``kernel_us`` (_play_pass)."""
    from traceana.estimator import timeline
    from traceana.estimator.estimate import estimate

    cfg = _with_ranks(cfg, options.ranks)
    frame = timeline.frame(estimate(cfg)).with_columns(dur_ns=(pl.col("end_ms") - pl.col("start_ms")) * 1e6)
    compute = pl.col("kind").is_in(COMPUTE_KINDS)
    per_step = frame.group_by("stage").agg(
        pl.when(compute).then(pl.max_horizontal(options.rounds, pl.col("dur_ns") / (options.kernel_us * 1e3)))
        .when(pl.col("kind").is_in(DIMS)).then(options.rounds).when(pl.col("kind") == "P2P").then(1)
        .otherwise(0).sum().alias("ops"))["ops"]
    ranks_per_stage = cfg.parallel.world_size // cfg.parallel.pp
    return (int(per_step.sum() * ranks_per_stage * options.steps),
            int(per_step.max() * ranks_per_stage * options.steps))


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
    chains: list[list[tuple]] = []   # per stage: the main chain's ops
    owners: list[pl.DataFrame] = []  # per stage: start, end, and the kind and micro_batch of the pass, of each op
    for stage in range(p.pp):
        ops, owner = [], []
        main = rows.filter((pl.col("stage") == stage) & (pl.col("kind") != "P2P")).sort("t0")
        for piece in _passes(main.select("kind", "micro_batch", "t0", "t1").rows()):
            played = _play_pass(piece, options.rounds, kernel_ns, nelems, intern)
            ops += played
            owner += [(o[1], o[1] + o[2], *piece[0][:2]) for o in played]
        chains.append(ops)
        owners.append(pl.DataFrame(owner, schema=["start", "end", "kind", "micro_batch"], orient="row"))
    sides: list[list[tuple]] = [[] for _ in range(p.pp)]
    for tid, (receiver, sender, mb, t0, t1) in enumerate(_transfers(frame)):
        producer = _producer(owners[sender], t0)
        kind = "F" if producer >= 0 and owners[sender]["kind"][producer] == "F" else "B"
        consumer = _consumer(owners[receiver], kind, mb, t1) if producer >= 0 else -1
        for stage, code, peer, link in ((sender, SEND, receiver, producer), (receiver, RECV, sender, consumer)):
            spec = COLLECTIVES["SEND" if code == SEND else "RECV"]
            sides[stage].append((code, t0, t1 - t0, DIMS.index("PP"), intern(spec.kernel), intern(spec.cpu_op),
                                 nelems["PP"], peer, link, tid))
    templates = []
    for ops, side in zip(chains, sides, strict=True):
        chain_end = np.array([o[1] + o[2] for o in ops])
        chained = np.zeros(len(ops), dtype=bool)
        if len(ops) > 1:
            chained[1:] = np.abs(np.array([o[1] for o in ops[1:]]) - chain_end[:-1]) < 1
        table = [(*o, -1, -1) for o in ops] + sorted(side, key=lambda o: (o[1], o[9]))  # planned order
        arrays = list(zip(*table, strict=True)) if table else [()] * 10
        templates.append(Template(
            code=np.array(arrays[0], dtype=np.int8), plan=np.array(arrays[1], dtype=np.int64),
            dur=np.array(arrays[2], dtype=np.int64), chained=np.concatenate([chained, np.zeros(len(side), bool)]),
            dim=np.array(arrays[3], dtype=np.int8), name=np.array(arrays[4], dtype=np.int32),
            cpu_op=np.array(arrays[5], dtype=np.int32), nelems=np.array(arrays[6], dtype=np.int64),
            peer_stage=np.array(arrays[7], dtype=np.int32), link=np.array(arrays[8], dtype=np.int32),
            transfer=np.array(arrays[9], dtype=np.int32)))
    return templates


def _transfers(frame: pl.DataFrame) -> list[tuple[int, int, int, int, int]]:
    """(receiver, sender, micro_batch, t0, t1) of each pipeline transfer, in planned order: the sender is the stage
    whose pass of the same micro-batch ended when the transfer started."""
    p2p = frame.filter(pl.col("kind") == "P2P").sort("t0").select("stage", "micro_batch", "t0", "t1").rows()
    passes = frame.filter(~pl.col("kind").is_in(["P2P", "BUBBLE"]) & (pl.col("micro_batch") >= 0))
    ends = {(mb, t1): s for s, mb, t1 in passes.select("stage", "micro_batch", "t1").rows()}
    out = []
    for stage, mb, t0, t1 in p2p:
        sender = ends.get((mb, t0))
        if sender is None:  # rounding put the end one ns away
            sender = next((s for (m, t), s in ends.items() if m == mb and abs(t - t0) <= 2 and s != stage), None)
        if sender is not None and sender != stage:
            out.append((stage, sender, mb, t0, t1))
    return out


def _producer(chain: pl.DataFrame, t0: int) -> int:
    """The sender's op whose end issues a transfer planned at ``t0``: the last main-chain op ending by then (-1:
    none; the chain's ends never decrease)."""
    return int(chain["end"].search_sorted(t0 + 2, side="right")) - 1


def _consumer(chain: pl.DataFrame, kind: str, mb: int, t1: int) -> int:
    """The receiver's op that needs a transfer planned to end at ``t1``: the first op, from then on, of a pass of
    ``kind`` (F for activations, B for gradients) and micro-batch ``mb`` (-1: none)."""
    found = chain.with_row_index().filter((pl.col("kind") == kind) & (pl.col("micro_batch") == mb)
                                          & (pl.col("start") >= t1 - 2))["index"]
    return int(found[0]) if len(found) else -1


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


class _Stage:
    """One pipeline stage's ranks playing its template, one step at a time, as arrays ranks x ops. The main chain
    runs in blocks: an op that waits for something (a collective's last member, its planned time after a gap, a
    pipeline transfer), then the ops chained to it."""

    def __init__(self, plan: Plan, index: int, groups: list[dict]) -> None:
        tpl = plan.templates[index]
        self.plan, self.index, self.tpl = plan, index, tpl
        self.ranks = plan.stage_ranks(index)
        n = len(self.ranks)
        local = {int(r): i for i, r in enumerate(self.ranks)}
        # per dim: each stage rank's group (local index of its first member) and pg name
        self.leader = np.tile(np.arange(n), (len(DIMS), 1))
        self.pg_of = np.full((len(DIMS), n), -1)
        for g in groups:
            members = [local[r] for r in g["ranks"] if r in local]
            d = DIMS.index(g["dim"])
            self.pg_of[d, members] = int(g["pg"])
            if len(members) == len(g["ranks"]):  # every group but PP lies inside one stage
                self.leader[d, members] = members[0]
        # per dim, its collectives: all members of a group share their jitter (transfers keep their planned time)
        self.shared = [(d, cols) for d in range(len(DIMS))
                       if (cols := np.flatnonzero((tpl.dim == d) & (tpl.code == COLLECTIVE))).size]
        self.compute = np.flatnonzero(tpl.code == COMPUTE)
        self.slow_rows = np.flatnonzero(plan.slow[self.ranks] != 1)  # the straggler's local index, if here
        main = np.flatnonzero(tpl.code <= COLLECTIVE)
        self.side = np.flatnonzero(tpl.code >= SEND)
        self.waits = np.full(len(tpl.code), -1)  # main op -> the column in self.side of the Recv it waits for
        recv = np.flatnonzero((tpl.code[self.side] == RECV) & (tpl.link[self.side] >= 0))
        self.waits[tpl.link[self.side[recv]]] = recv
        heads = [i for i in main if tpl.code[i] == COLLECTIVE or not tpl.chained[i] or self.waits[i] >= 0]
        self.blocks = list(itertools.pairwise([*heads, main[-1] + 1])) if len(main) else []

    def durations(self, step: int) -> np.ndarray:
        """Every op's length on every rank in ``step``: jittered (a collective's once per group instance), the
        straggler's compute slowed down. Seeded by stage and step, so that a replay draws the same."""
        tpl, options = self.tpl, self.plan.options
        z = np.random.default_rng([options.seed, 2, self.index, step]).standard_normal((len(self.ranks), len(tpl.code)))
        for d, cols in self.shared:
            z[:, cols] = z[np.ix_(self.leader[d], cols)]
        z *= options.jitter  # in place, as rint(dur * clip(1 + jitter * z, 0.5, 2)): no temporaries per step
        z += 1
        np.clip(z, 0.5, 2.0, out=z)
        z *= tpl.dur
        dur = np.rint(z, out=z).astype(np.int64)
        slow = np.ix_(self.slow_rows, self.compute)
        dur[slow] = np.rint(dur[slow] * self.plan.slow[self.ranks[self.slow_rows]][:, None]).astype(np.int64)
        return dur

    def play(self, block: int, t_step: int, dur: np.ndarray, start: np.ndarray, end: np.ndarray, free: np.ndarray,
             received: np.ndarray) -> None:
        """Play one block of a step: fills its columns of ``start`` and ``end`` (ranks x ops) and moves ``free``
        (when each rank's main chain is free) past it. ``received``: the end of each of the stage's transfers."""
        tpl = self.tpl
        i, j = self.blocks[block]
        s0 = free if tpl.chained[i] else np.maximum(free, t_step + tpl.plan[i])
        if self.waits[i] >= 0:
            s0 = np.maximum(s0, received[:, self.waits[i]])
        if tpl.code[i] == COLLECTIVE:
            leader = self.leader[tpl.dim[i]]
            last = np.full(len(s0), np.iinfo(np.int64).min)
            np.maximum.at(last, leader, s0)
            e0 = last[leader] + dur[:, i]
        else:
            e0 = s0 + dur[:, i]
        start[:, i], end[:, i] = s0, e0
        if j > i + 1:
            ends = e0[:, None] + np.cumsum(dur[:, i + 1:j], axis=1)
            end[:, i + 1:j] = ends
            start[:, i + 1:j] = ends - dur[:, i + 1:j]
        free[:] = end[:, j - 1]


@dataclass
class Coupling:
    """What the stages share: when steps start, and the pipeline transfers' times."""

    step_starts_ns: np.ndarray     # when each step starts on every rank
    transfers: list[np.ndarray]    # per stage: its transfers' (start, end) x ranks x steps x transfers


class _Pair(NamedTuple):
    """A transfer as :func:`_couple` plays it."""

    sender: int          # stage
    send: int            # the Send's column in the sender's side ops
    producer: int        # the sender's op whose end starts the Send (-1: its planned time)
    receiver: int        # stage
    recv: int            # the Recv's column in the receiver's side ops
    consumed: bool       # the Recv starts when the receiver reaches its consumer (False: at its planned time)
    senders: np.ndarray  # each receiver rank's sender, as a local index on the sender's stage
    t0: int              # planned start
    length: int          # transfer time


def _couple(plan: Plan, stages: list[_Stage]) -> Coupling:
    """Play every stage's step together, step by step, keeping what a stage's replay needs from the others: the step
    starts and the times of its pipeline transfers.

    A transfer is a Send on the sender and a Recv on the receiver, on their pipeline streams. As with PyTorch's
    NCCL streams, each kernel starts when the work enqueued before it is done: the Send when its producing op ends,
    the Recv when the receiver's main chain reaches the consuming op. Both end together, at the later start plus
    the planned transfer time, and the consuming op starts no earlier. Blocks run in planned order across the
    stages, a transfer just before its consumer's block: its producer, planned to end when the transfer starts, has
    run by then. A step ends for everyone with the last rank's work (the optimizer's sync); the next starts a host
    gap later."""
    steps = plan.options.steps
    gap = round(plan.options.step_gap_us * 1e3)
    step_starts = np.zeros(steps, dtype=np.int64)
    times = [np.zeros((2, len(s.ranks), steps, len(s.side)), dtype=np.int64) for s in stages]
    # transfer -> (stage, column in its side ops) of its Send and of its Recv
    members: dict[int, dict[int, tuple[int, int]]] = {}
    for s in stages:
        for col, op in enumerate(s.side):
            members.setdefault(int(s.tpl.transfer[op]), {})[int(s.tpl.code[op])] = (s.index, col)
    order = [(int(s.tpl.plan[i]), 1, s.index, b) for s in stages for b, (i, _) in enumerate(s.blocks)]
    pairs = []
    for k, where in enumerate(members.values()):
        (a, ca), (b, cb) = where[SEND], where[RECV]
        send, recv = stages[a].side[ca], stages[b].side[cb]
        consumer = int(stages[b].tpl.link[recv])
        pairs.append(_Pair(a, ca, int(stages[a].tpl.link[send]), b, cb, consumer >= 0,
                           np.searchsorted(stages[a].ranks, plan.peers(stages[b].ranks, a)),
                           int(stages[b].tpl.plan[recv]), int(stages[b].tpl.dur[recv])))
        order.append((int(stages[b].tpl.plan[consumer if consumer >= 0 else recv]), 0, k, 0))
    order.sort()
    start = [np.empty((len(s.ranks), len(s.tpl.code)), dtype=np.int64) for s in stages]
    end = [np.empty_like(e) for e in start]
    t_step = 0
    for step in range(steps):
        step_starts[step] = t_step
        durs = [s.durations(step) for s in stages]
        free = [np.full(len(s.ranks), t_step, dtype=np.int64) for s in stages]
        for _, is_block, x, block in order:
            if is_block:
                stages[x].play(block, t_step, durs[x], start[x], end[x], free[x], times[x][1, :, step])
                continue
            p = pairs[x]
            send_start = end[p.sender][p.senders, p.producer] if p.producer >= 0 else np.full(len(p.senders),
                                                                                               t_step + p.t0)
            recv_start = free[p.receiver].copy() if p.consumed else np.full(len(p.senders), t_step + p.t0)
            done = np.maximum(send_start, recv_start) + p.length
            times[p.sender][:, p.senders, step, p.send] = send_start, done
            times[p.receiver][:, :, step, p.recv] = recv_start, done
        t_step = max(max(f.max(initial=t_step), t[1, :, step].max(initial=t_step))
                     for f, t in zip(free, times, strict=True)) + gap
    return Coupling(step_starts, times)


def _replay(plan: Plan, stage: _Stage, step_starts: np.ndarray, transfers: np.ndarray) -> Iterator[RankTrace]:
    """One stage's ranks for every step, replaying :func:`_couple` with the same draws and its transfer times."""
    options, tpl = plan.options, stage.tpl
    n, k = len(stage.ranks), len(tpl.code)
    start = np.empty((n, options.steps, k), dtype=np.int64)
    end = np.empty((n, options.steps, k), dtype=np.int64)
    for step in range(options.steps):
        t_step = int(step_starts[step])
        dur = stage.durations(step)
        free = np.full(n, t_step, dtype=np.int64)
        for block in range(len(stage.blocks)):
            stage.play(block, t_step, dur, start[:, step], end[:, step], free, transfers[1, :, step])
        start[:, step, stage.side] = transfers[0, :, step]
        end[:, step, stage.side] = transfers[1, :, step]
    peer_stages = np.unique(tpl.peer_stage[tpl.peer_stage >= 0])
    peer_ranks = np.full((n, plan.layout.pp + 1), -1)  # column -1 (no peer) stays -1
    for s in peer_stages:
        peer_ranks[:, s] = plan.peers(stage.ranks, s)
    for i, rank in enumerate(stage.ranks):
        peer = peer_ranks[i, tpl.peer_stage]
        dim = tpl.dim.astype(np.int64)
        pg = np.where(dim >= 0, stage.pg_of[np.clip(dim, 0, None), i], -1)
        op = np.tile(np.arange(k, dtype=np.int32), options.steps)
        ops = pl.DataFrame({
            "step": np.repeat(np.arange(options.steps, dtype=np.int32), k), "op": op,
            "code": np.tile(tpl.code, options.steps),
            "start_ns": start[i].ravel(), "end_ns": end[i].ravel(),
            "dim": np.tile(tpl.dim, options.steps), "name": np.tile(tpl.name, options.steps),
            "cpu_op": np.tile(tpl.cpu_op, options.steps), "nelems": np.tile(tpl.nelems, options.steps),
            "pg": np.tile(pg, options.steps).astype(np.int32), "peer": np.tile(peer, options.steps).astype(np.int32),
        })[np.lexsort((op, end[i].ravel(), start[i].ravel()))]  # by start, end, op: 4x Polars' multi-key sort
        host = plan.host_of(int(rank))
        yield RankTrace(int(rank), stage.index, f"node{host:04d}", host, int(rank) % options.ranks_per_host,
                        plan.host_offsets_ns[host] + plan.device_offsets_ns[rank], ops, step_starts)


def launch_times(trace: RankTrace) -> pl.Series:
    """Host launch times, true time, in the order of ``trace.ops`` (see :func:`host_launches`)."""
    return host_launches(trace)["launch_ns"]


def host_launches(trace: RankTrace) -> pl.DataFrame:
    """Each op's host launch, true time, in the order of ``trace.ops``: ``launch_ns`` and ``late`` (the cap below
    bound). The main thread runs ahead of the device at a fixed pace: a step's first launch is ``LAUNCH_LEAD_NS``
    before the step's planned start (the same instant on every rank, after the last rank's sync), each next one
    ``HOST_PACE_NS`` after the previous, but never later than ``LAUNCH_LEAD_NS`` before its own kernel:
    ``launch_j = min(launch_{j-1} + pace, start_j - lead)``, a running minimum per step. Where that cap binds, the
    host at its pace would have been late for the kernel, and the device timeline as planned assumes it launched
    faster there; at the default options it never binds (:func:`late_launches` counts). Pipeline transfers launch
    from their own thread, which runs ahead the same way (:func:`_side_launches`); a Recv posted before the rank's
    first kernel of the step (stages after the first wait for their first activation) belongs to the step before, as
    the truth's windows say (:mod:`traceana.synth.truth`), so there the step's first launch waits until
    ``STEP_OPEN_NS`` after it (its ProfilerStep opens after that Recv's launch) and its kernel waits on the device
    for the Recv."""
    ops = trace.ops
    code, step, start, op = (ops[c].to_numpy() for c in ("code", "step", "start_ns", "op"))
    side = np.flatnonzero(code > COLLECTIVE)
    main = np.flatnonzero(code <= COLLECTIVE)
    main = main[np.lexsort((op[main], start[main], step[main]))]  # issue order: by step, then start
    m_start, m_step = start[main], step[main]
    head = np.searchsorted(m_step, m_step)  # each main op's step's first main op (its index in main)
    k = np.arange(len(main)) - head         # the step's k-th launch
    first_start = np.full(len(trace.step_starts_ns), np.iinfo(np.int64).max)
    first_start[m_step[head]] = m_start[head]
    pre = side[start[side] < first_start[step[side]]]  # Recvs posted before the step's first kernel
    posted = np.full(len(first_start), np.iinfo(np.int64).min // 2)
    np.maximum.at(posted, step[pre], start[pre])
    first = np.maximum(trace.step_starts_ns, posted + STEP_OPEN_NS + 1) - LAUNCH_LEAD_NS
    ahead = np.minimum(m_start - LAUNCH_LEAD_NS - HOST_PACE_NS * k, first[m_step])
    paced = _running_min_per_step(ahead, m_step) + HOST_PACE_NS * k
    launch = np.empty(len(code), dtype=np.int64)
    launch[main], launch[side] = paced, _side_launches(start[side], step[side], op[side], first + 1,
                                                        start[side] < first_start[step[side]])
    late = np.zeros(len(code), dtype=bool)
    late[main] = paced < np.where(k > 0, np.roll(paced, 1) + HOST_PACE_NS, first[m_step])
    return pl.DataFrame({"launch_ns": launch, "late": late})


def _running_min_per_step(values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The running minimum of ``values`` within each step (rows ordered by step), in one pass: each later step is
    lowered by the values' whole span, so one accumulate never carries a minimum into the next step (int64: step x
    span outgrows int32 on long runs)."""
    span = int(values.max() - values.min()) + 1 if len(values) else 1
    lift = steps.astype(np.int64) * span
    return np.minimum.accumulate(values - lift) + lift


def _side_launches(start: np.ndarray, step: np.ndarray, op: np.ndarray, opens: np.ndarray,
                   pre: np.ndarray) -> np.ndarray:
    """The pipeline thread's launches, in the order given: it runs ahead as the main thread does, from ``opens`` (per
    step: just after the main thread's first launch) at the host's pace and never later than the lead before its
    transfer; a Recv posted before the step's first kernel (``pre``) launches the lead before it starts, in the step
    before."""
    order = np.lexsort((op, start, step))
    s_start, s_step = start[order], step[order]
    head = np.searchsorted(s_step, s_step)
    k = np.arange(len(order)) - head
    ahead = np.minimum(s_start - LAUNCH_LEAD_NS - HOST_PACE_NS * k, opens[s_step] if len(order) else 0)
    paced = _running_min_per_step(ahead, s_step) + HOST_PACE_NS * k
    launch = np.empty(len(order), dtype=np.int64)
    launch[order] = paced
    return np.where(pre, start - LAUNCH_LEAD_NS, launch)


def late_launches(trace: RankTrace) -> int:
    """How many main-thread launches the cap of :func:`host_launches` moved earlier than the host's pace."""
    return int(host_launches(trace)["late"].sum())


def device_syncs(ops: pl.DataFrame, launch: pl.Series) -> pl.DataFrame:
    """Each step's ``cudaDeviceSynchronize`` on the main thread, true time: step, ``start_ns`` (when its last launch
    call returns), ``device_end_ns`` (when the rank's last device work of the step, transfers included, ends) and
    ``end_ns`` (when the call returns, ``SYNC_RETURN_NS`` later). A step ends for everyone with the last rank's
    work, so the host's next step starts on every rank ``step_gap_us - SYNC_RETURN_NS - LAUNCH_LEAD_NS`` after the
    *last* rank's sync returns (a barrier, 293 µs at the default gap): the main thread's first launch there, or, on a
    rank that posts a Recv before its first kernel, that Recv's launch and the main thread's ``STEP_OPEN_NS`` (+1 ns)
    later. A rank that finished early waits for the others in that host gap. Options checks that the gap holds the
    return, the launch lead and the ProfilerStep's opening."""
    main = pl.col("code") <= COLLECTIVE
    return ops.with_columns(launch.alias("_l")).group_by("step").agg(
        (pl.col("_l").filter(main).max() + LAUNCH_CALL_NS).alias("start_ns"),
        pl.col("end_ns").max().alias("device_end_ns"),
    ).sort("step").with_columns((pl.col("device_end_ns") + SYNC_RETURN_NS).alias("end_ns"))
