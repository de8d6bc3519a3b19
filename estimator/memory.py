"""Peak device memory of each pipeline stage, by component, and whether it fits.

Model states: parameters, gradients and optimizer state per parameter a GPU holds (Precision: bf16 weights, fp32
main grads, fp32 Adam = 2 + 4 + 12 bytes), sharded by the ZeRO level over the dp x cp group (Megatron's
distributed optimizer group). Routed experts are split by ep x etp, and ZeRO-1 shards their optimizer state over
the expert-data-parallel group; with ``expert_zero3_sharding`` ZeRO-2 / 3 shard their gradients / parameters
there too, which cancels EP (seed 000 P2), and without it EP alone shrinks them, linearly.

Activations per layer and micro-batch follow Korthikanti et al. 2022 (34·s·b·h + 5·a·s²·b bytes for GPT, with
tensor / sequence parallelism and selective / full recompute), generalized to GQA, gated MLPs, FlashAttention
(no s x s scores kept), no dropout, DeepSeek-V3's FP8 caching and MoE (each routed token copy keeps its expert
input and FFN intermediates). A stage keeps as many micro-batches in flight as its simulated schedule does (1F1B
stage i: min(pp - i, m)). The runtime overheads seed 000 P1 found (output-layer activations, communication double
buffers, graph memory) are ``safety_buffer_mb / tp`` and ``tp_shardable_overhead_mb / tp``.

The components sum to the allocated peak (torch.cuda.max_memory_allocated); ``reserved_and_used`` adds what the
caching allocator keeps (max_memory_reserved) and what lies outside it, NCCL's buffers and the CUDA context (the
device's used memory).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, fields

from traceana.estimator import stages
from traceana.estimator.compute import CROSS_ENTROPY, tokens
from traceana.estimator.config import Config

MIB = 1024**2
GIB = 1024**3
ROUND_LARGE = 2 * MIB  # the caching allocator's segment granularity for large requests


@dataclass(frozen=True)
class Params:
    """Parameters one GPU holds for a piece of the model, before ZeRO sharding: dense (incl. shared experts) and
    routed-expert counts."""

    dense: float = 0.0
    expert: float = 0.0

    def __add__(self, other: Params) -> Params:
        return Params(self.dense + other.dense, self.expert + other.expert)

    def __mul__(self, k: float) -> Params:
        return Params(self.dense * k, self.expert * k)


def _mlp_params(cfg: Config, ffn: float) -> float:
    return (3 if cfg.model.gated_mlp else 2) * cfg.model.hidden * ffn


def attention_params(cfg: Config) -> float:
    """One layer's attention weights (whole, before TP)."""
    m = cfg.model
    if not m.attention:
        return 0.0
    if m.mla:
        qk, v = m.hd + m.qk_rope_head_dim, m.v_head_dim or m.hd
        q = m.hidden * m.q_lora_rank + m.q_lora_rank * m.heads * qk if m.q_lora_rank else m.hidden * m.heads * qk
        return q + m.hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.heads * (m.hd + v) \
            + m.heads * v * m.hidden
    return m.hidden * (2 * m.heads * m.hd + 2 * m.kv * m.hd)


def layer_params(cfg: Config, index: int) -> Params:
    """One layer's parameters on one GPU: attention and dense/shared MLP split by tp, routed experts by ep x etp."""
    m, p = cfg.model, cfg.parallel
    dense = (attention_params(cfg) + 4 * m.hidden) / p.tp
    if not m.is_moe(index):
        return Params(dense + _mlp_params(cfg, m.ffn_hidden) / p.tp)
    shared = _mlp_params(cfg, m.expert_ffn * m.shared_experts) / p.tp + m.hidden * m.experts
    return Params(dense + shared, m.experts * _mlp_params(cfg, m.expert_ffn) / (p.ep * p.expert_tp))


def embedding_params(cfg: Config) -> float:
    return cfg.model.vocab * cfg.model.hidden / cfg.parallel.tp


def layer_kinds(cfg: Config, layers: range) -> Counter[int]:
    """The layers of ``layers`` grouped by what decides their cost (dense or MoE, recompute kind): a representative
    index -> how many layers share it. Costs are computed once per kind, not once per layer."""
    first: dict[tuple[bool, str], int] = {}
    counts: Counter[int] = Counter()
    for i in layers:
        counts[first.setdefault((cfg.model.is_moe(i), cfg.schedule.recompute.kind_of(i)), i)] += 1
    return counts


def device_params(cfg: Config, chunk_layers: list[range]) -> list[Params]:
    """Parameters per pipeline device (all its chunks), with the embedding on the first chunk's device and the
    output layer on the last chunk's (a tied output layer on a single device counts once)."""
    pp = cfg.parallel.pp
    result = [Params()] * pp
    for k, layers in enumerate(chunk_layers):
        device = stages.device_of_chunk(cfg, k)
        for i, n in layer_kinds(cfg, layers).items():
            result[device] = result[device] + layer_params(cfg, i) * n
    first, last = stages.device_of_chunk(cfg, 0), stages.device_of_chunk(cfg, len(chunk_layers) - 1)
    result[first] = result[first] + Params(embedding_params(cfg))
    if not (cfg.model.tied_embeddings and first == last):
        result[last] = result[last] + Params(embedding_params(cfg))
    if cfg.schedule.kind == "dualpipe":  # each device also holds the mirror stage: two copies of the parameters
        result = [result[i] + result[pp - 1 - i] for i in range(pp)]
    return result


def layer_activation_bytes(cfg: Config, index: int) -> float:
    """Bytes one layer keeps from its forward until its backward, for one micro-batch on one GPU. What the recompute
    modules recompute is not kept. precision.fp8_activations is DeepSeek-V3's caching (arXiv 2412.19437 §3.3.2):
    a linear layer's saved input in FP8 (1 byte; the routed experts' is the FP8 copy their dispatch sends), the
    output projection's input in E5M6 (1.5 bytes, shared with the attention's backward), and in MoE layers the
    SwiGLU's inputs in FP8 too."""
    m, p = cfg.model, cfg.parallel
    t, h, a = tokens(cfg), m.hidden, cfg.precision.activation_bytes
    replicated_div = p.tp if p.sequence_parallel else 1
    recompute = cfg.schedule.recompute
    if recompute.kind_of(index) == "full":
        return a * t * h / replicated_div
    fp8 = cfg.precision.fp8_activations
    linear = 1 if fp8 else a  # a linear layer's saved input
    q = m.heads * (m.hd + m.qk_rope_head_dim) / p.tp
    kv = (m.heads * (2 * m.hd + m.qk_rope_head_dim) / p.tp if m.mla
          else 2 * max(1, m.kv // p.tp) * m.hd if m.kv < p.tp else 2 * m.kv * m.hd / p.tp)
    # per block (attention, MLP): its layer norm's input (a bytes), the norm's output (the block's first linear
    # layer's input) and, with dropout, a 1-byte mask
    norm_out = 0.0 if recompute.recomputes(index, "layernorm") else linear
    mask = 1 if m.dropout else 0
    replicated = t * h * (a + norm_out + mask) * (2 if m.attention else 1) / replicated_div
    if recompute.recomputes(index, "mla_up_proj"):  # Q, K, V come again from the kept latents
        qkv = a * t * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim)
    else:
        qkv = a * t * (q + kv)
    out = m.heads * (m.v_head_dim or m.hd) / p.tp  # the attention's output: the output projection's input
    attention = qkv + (1.5 if fp8 else a) * t * out if m.attention else 0.0
    if m.attention and not m.flash_attention and not recompute.recomputes(index, "core_attn"):
        attention += (2 * a + mask) * (m.heads / p.tp) * t * m.seq_len  # softmax out, dropout mask and out
    # per FFN unit: gate and up outputs (fc1's output for GeLU) and the activation's output, fc2's input
    gate_up = (2 if m.gated_mlp else 1) * (linear if m.is_moe(index) else a)
    per_ffn = gate_up + (0.0 if recompute.recomputes(index, "activation") else linear)
    if m.is_moe(index):
        copies = t * m.moe_topk * m.routed_load / p.tp
        # a routed copy keeps its input and, scaled at the combine, its output for the routing weight's gradient
        kept = linear + (a if m.moe_weighting == "combine" else 0)
        routed = copies * (kept * h * p.expert_tp + per_ffn * m.expert_ffn)
        mlp = routed + per_ffn * t * m.expert_ffn * m.shared_experts / p.tp
    else:
        mlp = per_ffn * t * m.ffn_hidden / p.tp
    return replicated + attention + mlp


def end_devices(cfg: Config, chunks: int) -> set[int]:
    """The devices that run the loss: the last chunk's; under DualPipe both ends, each holding the output layer
    (its own chunk's or its mirror's) for the micro-batches that enter at the other end."""
    last = stages.device_of_chunk(cfg, chunks - 1)
    return {last, cfg.parallel.pp - 1 - last} if cfg.schedule.kind == "dualpipe" else {last}


def largest_transient_bytes(cfg: Config, loss: bool) -> float:
    """The largest single tensor a pass allocates and frees on one GPU: the loss's fp32 logits (t x vocab x 4
    bytes) on a device that runs the loss, else the MLP's first product (gate and up outputs; for MoE the routed
    copies' grouped product or their dispatch buffer) or, without FlashAttention, the attention scores."""
    m, p, a = cfg.model, cfg.parallel, cfg.precision.activation_bytes
    t = tokens(cfg)
    width = 2 if m.gated_mlp else 1
    if m.experts:
        copies = t * m.moe_topk * m.routed_load / p.tp
        mlp = max(copies * width * m.expert_ffn, copies * m.hidden * p.expert_tp) * a
    else:
        mlp = t * width * m.ffn_hidden / p.tp * a
    scores = 0.0 if m.flash_attention or not m.attention else a * m.heads / p.tp * t * m.seq_len
    logits = 4 * t * m.vocab / p.tp if loss and m.vocab else 0.0
    return max(mlp, scores, logits)


def allocator_cache_bytes(cfg: Config, loss: bool) -> float:
    """What PyTorch's caching allocator reserves beyond the allocated peak (max_memory_reserved less
    max_memory_allocated), not counting what it rounds (512-byte blocks, large requests in segments of 2 MiB
    multiples: c10/cuda/CUDACachingAllocator.cpp, kRoundLarge), which is small at training sizes (3 MiB on the
    H200 GPT trace, its live blocks at the peak rounded by hand). What it does keep is a freed block too split up
    to serve its size again: the step's largest transient tensor, freed after its pass and carved by the smaller
    requests that follow, needs a new segment the next time it is asked for. So: one largest transient tensor,
    rounded up to a 2 MiB segment."""
    return math.ceil(largest_transient_bytes(cfg, loss) / ROUND_LARGE) * ROUND_LARGE


def nccl_buffer_bytes(cfg: Config, device: int, chunks: int) -> float:
    """NCCL's own buffers on one GPU, allocated outside PyTorch's allocator (in neither allocated nor reserved):
    NCCL_BUFFSIZE per channel and connected peer of each communicator it belongs to. Ring collectives (tp, cp, the
    gradients' dp x cp, the experts' edp) connect the previous and next rank on ``nccl_channels`` channels; the
    expert all-to-all and the pipeline's send / receive connect each peer they address on 2 channels
    (NCCL_NCHANNELS_PER_NET_PEER's default). ``chunks``: the model chunks, whose neighbours are the pipeline's."""
    p, cal = cfg.parallel, cfg.calibration
    rings = [n for n in (p.tp, p.cp, p.dp * p.cp, p.layout.edp if cfg.model.experts else 1) if n > 1]
    owner = [stages.device_of_chunk(cfg, k) for k in range(chunks)]
    neighbours = {owner[j] for k in range(chunks) if owner[k] == device for j in (k - 1, k + 1) if 0 <= j < chunks}
    peers = sum(2 if n > 2 else 1 for n in rings) * cal.nccl_channels + 2 * (p.ep - 1 + len(neighbours - {device}))
    return peers * cal.nccl_buffer_mb * MIB


def reserved_and_used(cfg: Config, chunk_layers: list[range], allocated: list[float]) -> list[tuple[float, float]]:
    """Per pipeline device, from its allocated peak: (reserved, used). Reserved is what torch.cuda.
    max_memory_reserved reports (the allocated peak and the allocator's cache); used is the device's, as
    nvidia-smi reports it: reserved, NCCL's buffers and the CUDA context."""
    ends = end_devices(cfg, len(chunk_layers))
    context = cfg.calibration.cuda_context_mb * MIB
    result = []
    for device, peak in enumerate(allocated):
        reserved = peak + allocator_cache_bytes(cfg, device in ends)
        result.append((reserved, reserved + nccl_buffer_bytes(cfg, device, len(chunk_layers)) + context))
    return result


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes of one pipeline device by component."""

    params: float
    grads: float
    optimizer: float
    activations: float
    comm_buffers: float
    overheads: float

    @property
    def peak(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def states(cfg: Config, held: Params) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of the parameters ``held``, after ZeRO sharding.

    Dense states shard over dp x cp (or the HSDP shard group). Megatron's distributed optimizer keeps the routed
    experts in buffers of their own, sharded over the expert-data-parallel group (edp ranks hold the same experts):
    ZeRO-1 shards their optimizer state there whatever ``expert_zero3_sharding`` says. As ep x etp x edp is the
    fixed tp x cp x dp, that state does not shrink with EP; the parameters and gradients do, and only they (seed
    000's measured peaks fall 885 then 442 MiB from EP 2 to 4 to 8 at TP 1 and 2: 6 bytes a parameter, not 18).
    ZeRO-2 / 3 shard expert gradients / parameters over edp only with ``expert_zero3_sharding`` (seed 000 P2:
    DeepSeek-V3 does not, and EP alone splits them)."""
    p, prec = cfg.parallel, cfg.precision
    group = (p.zero_shard or p.dp) * p.cp
    out = []
    for level, size in ((3, prec.param_bytes), (2, prec.grad_bytes), (1, prec.optimizer_bytes)):
        shard = p.zero >= level
        expert_group = p.layout.edp if shard and (level == 1 or p.expert_zero3_sharding) else 1
        out.append(held.dense * size / (group if shard else 1) + held.expert * size / expert_group)
    return out[0], out[1], out[2]


def comm_buffer_bytes(cfg: Config) -> float:
    """Buffers the collectives allocate beside the tensors: all-to-all send + receive (the dispatch in FP8 with
    precision.fp8_activations, DeepSeek-V3 §3.3.2; the combine in BF16), the sequence-parallel all-gather output,
    and the pipeline's send + receive."""
    p, m, a = cfg.parallel, cfg.model, cfg.precision.activation_bytes
    t = tokens(cfg)
    dispatch = 1 if cfg.precision.fp8_activations else a
    ep = (dispatch + a) * t / (p.tp if p.sequence_parallel else 1) * m.moe_topk * m.routed_load * m.hidden \
        if p.ep > 1 else 0.0
    sp = t * m.hidden * a if p.sequence_parallel and p.tp > 1 else 0.0
    pp = 2 * t * m.hidden * a / (p.tp if p.sequence_parallel else 1) if p.pp > 1 else 0.0
    return ep + sp + pp


def loss_bytes(cfg: Config) -> float:
    """What the last stage holds at the peak of its loss, for one micro-batch: the final norm's output (fp32,
    Korthikanti §4.3) and the logits' buffers as ``model.cross_entropy`` computes them (compute.CROSS_ENTROPY:
    14 bytes a logit in eager PyTorch, 6 in Megatron's in-place loss; not the 4 of one fp32 copy)."""
    m, p, t = cfg.model, cfg.parallel, tokens(cfg)
    held = CROSS_ENTROPY[m.cross_entropy].held
    return (4 * t * m.hidden + held * t * m.vocab) / p.tp if m.vocab else 0.0


def stage_memory(cfg: Config, chunk_layers: list[range], depth: list[float]) -> list[StageMemory]:
    """Peak memory of every pipeline device, in device order. ``depth`` is each device's peak in-flight
    micro-batches in units of its share of layers, as the schedule keeps them (pipeline.in_flight)."""
    p, m = cfg.parallel, cfg.model
    held = device_params(cfg, chunk_layers)
    activation = [0.0] * p.pp
    for k, layers in enumerate(chunk_layers):
        activation[stages.device_of_chunk(cfg, k)] += sum(layer_activation_bytes(cfg, i) * n
                                                          for i, n in layer_kinds(cfg, layers).items())
    if cfg.schedule.kind == "dualpipe":  # a device's micro-batches run through its own and its mirror stage
        activation = [(activation[i] + activation[p.pp - 1 - i]) / 2 for i in range(p.pp)]
    t, div = tokens(cfg), p.tp if p.sequence_parallel else 1
    ends = end_devices(cfg, len(chunk_layers))
    starts = ends if cfg.schedule.kind == "dualpipe" else {stages.device_of_chunk(cfg, 0)}  # the embedding's
    embedding = (t * m.hidden / div * m.dropout + 8 * t) if m.vocab else 0.0  # its dropout mask, token ids
    output = loss_bytes(cfg)
    overheads = (cfg.calibration.safety_buffer_mb + cfg.calibration.tp_shardable_overhead_mb) * MIB / p.tp
    buffers = comm_buffer_bytes(cfg)
    result = []
    for device in range(p.pp):
        edges = (embedding * depth[device] if device in starts else 0.0) + (output if device in ends else 0.0)
        params, grads, optimizer = states(cfg, held[device])
        result.append(StageMemory(params, grads, optimizer, activation[device] * depth[device] + edges, buffers,
                                  overheads))
    return result
