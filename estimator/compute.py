"""FLOPs of one micro-batch through each piece of the model on one GPU, from the shapes.

Counted as 2 FLOPs per multiply-add of every matmul, the way Narayanan et al. (SC'21, eq. 3) count them, so that
``72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))`` is what a GPT model with ffn = 4h comes to. A matmul's backward is two
matmuls of the forward's size: the input gradient (``backward``, on the critical path of the pipeline) and the
weight gradient (``wgrad``, which zero-bubble schedules defer). The attention core (QKᵀ and the weighted sum of V)
has no weights, so its backward is all input gradient (twice the forward). Recompute repeats forward work before
the backward: the whole layer for ``full``, the attention core for ``selective`` (Korthikanti et al. 2022).
FlashAttention skips the masked half of a causal score matrix, so its core costs half the dense count.

The kernels between the matmuls (layer norms, bias-dropout-add, activation functions, and without FlashAttention
the softmax and dropout over the s x s scores) do few FLOPs but stream their tensors through HBM, so they are
priced by the bytes they move (:func:`layer_traffic`) at the device's memory bandwidth, as Calculon does. Their
share of a layer grows as 1/hidden, which is why small models reach a lower fraction of peak.

With a hardware profile (estimator.hardware) time comes from shapes instead: each matrix product of the layer at its
(m, n, k) — the forward's, the input gradient's (m, k, n) and the weight gradient's (k, n, m) — the attention core
from the profile's attention table, and the elementwise bytes at the bandwidth measured for their size.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceana.estimator import hardware
from traceana.estimator.config import Config


@dataclass(frozen=True)
class Work:
    """FLOPs of one micro-batch through one piece of the model on one GPU."""

    forward: float
    backward: float       # input gradients
    wgrad: float          # weight gradients
    recompute: float = 0.0  # forward work repeated just before the backward

    def __add__(self, other: Work) -> Work:
        return Work(self.forward + other.forward, self.backward + other.backward, self.wgrad + other.wgrad,
                    self.recompute + other.recompute)

    def __mul__(self, k: float) -> Work:
        return Work(self.forward * k, self.backward * k, self.wgrad * k, self.recompute * k)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.wgrad + self.recompute


def tokens(cfg: Config) -> float:
    """Tokens of one micro-batch that one GPU computes on (context parallelism splits the sequence)."""
    return cfg.parallel.micro_batch * cfg.model.seq_len / cfg.parallel.cp


def _matmul(flops: float) -> Work:
    return Work(flops, flops, flops)


def attention(cfg: Config) -> tuple[float, float]:
    """(projection FLOPs, core FLOPs) of one layer's attention forward on one GPU."""
    m, tp, t = cfg.model, cfg.parallel.tp, tokens(cfg)
    if not m.attention:
        return 0.0, 0.0
    if m.mla:
        qk = m.hd + m.qk_rope_head_dim
        v = m.v_head_dim or m.hd
        q = m.hidden * m.q_lora_rank + m.q_lora_rank * m.heads * qk if m.q_lora_rank else m.hidden * m.heads * qk
        kv = m.hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.heads * (m.hd + v)
        projection = 2 * t * (q + kv + m.heads * v * m.hidden) / tp
        core = 2 * t * m.seq_len * m.heads * (qk + v) / tp
    else:
        q, kv = m.heads * m.hd, m.kv * m.hd
        projection = 2 * t * m.hidden * (2 * q + 2 * kv) / tp
        core = 4 * t * m.seq_len * q / tp
    return projection, core * (0.5 if m.flash_attention else 1.0)


def mlp(cfg: Config, ffn: float) -> float:
    """Forward FLOPs of a feed-forward block of width ``ffn`` on one GPU (split by TP)."""
    matrices = 3 if cfg.model.gated_mlp else 2
    return 2 * matrices * tokens(cfg) * cfg.model.hidden * ffn / cfg.parallel.tp


def moe_parts(cfg: Config) -> tuple[float, float]:
    """(routed-expert + router FLOPs, shared-expert FLOPs) of one MoE layer forward on one GPU.

    The stage's tp·cp·dp GPUs share the routed work of dp replicas evenly (balanced routing), so one GPU does
    1/(tp·cp) of a replica's tokens x top-k expert passes, whatever ep and etp are, times model.routed_load: the
    capacity every expert is padded to, or under dropless routing the most loaded EP rank's share.
    """
    m = cfg.model
    routed = mlp(cfg, m.expert_ffn) * m.moe_topk * m.routed_load
    router = 2 * tokens(cfg) * m.hidden * m.experts
    return routed + router, mlp(cfg, m.expert_ffn * m.shared_experts)


def layer(cfg: Config, index: int) -> Work:
    """One transformer layer (dense or MoE by its index), with the recompute its layer is configured for."""
    projection, core = attention(cfg)
    if cfg.model.is_moe(index):
        routed, shared = moe_parts(cfg)
        ffn = routed + shared
    else:
        ffn = mlp(cfg, cfg.model.ffn_hidden)
    weights = projection + ffn
    recompute = cfg.schedule.recompute
    if recompute.kind_of(index) == "full":
        again = weights + core
    else:
        again = (core if recompute.recomputes(index, "core_attn") else 0.0) + (
            sum(g.flops for g in layer_gemms(cfg, index) if g.group == "mla_up_proj")
            if recompute.recomputes(index, "mla_up_proj") else 0.0)
    return _matmul(weights) + Work(core, 2 * core, 0.0, again)


def layer_traffic(cfg: Config, index: int) -> Work:
    """HBM bytes the elementwise kernels of one layer move for one micro-batch on one GPU (Megatron's fused kernels:
    layer norm reads and writes its tensor, bias-dropout-add reads two and writes one plus a 1-byte mask, the
    activation reads its inputs and writes its output; unfused scores: the QKᵀ output written, scaled-masked
    softmax read and written, dropout read and written with its mask, read again by the AV product). The backward
    moves about twice the forward's bytes; recompute moves them again."""
    m, p, a = cfg.model, cfg.parallel, cfg.precision.activation_bytes
    t = tokens(cfg)
    blocks = 2 if m.attention else 1  # a layer norm and a bias-dropout-add per block, per token x hidden
    replicated = blocks * (2 * a + 3 * a + (1 if m.dropout else 0))
    per_row = t * m.hidden / (p.tp if p.sequence_parallel else 1)
    rows = replicated * per_row
    ffn = m.expert_ffn * (m.moe_topk * m.routed_load + m.shared_experts) if m.is_moe(index) else m.ffn_hidden
    activation = (3 if m.gated_mlp else 2) * a * t * ffn / p.tp  # SwiGLU reads gate and up, writes the product
    scores = 0.0 if m.flash_attention or not m.attention else (6 * a + 1) * t * m.seq_len * m.heads / p.tp
    forward = rows + activation + scores
    cast = fp8_cast_traffic(cfg, layer_gemms(cfg, index)) if cfg.precision.fp8 else Work(0.0, 0.0, 0.0)
    recompute = cfg.schedule.recompute
    again = forward if recompute.kind_of(index) == "full" else (
        scores * recompute.recomputes(index, "core_attn")
        + blocks * 2 * a * per_row * recompute.recomputes(index, "layernorm")
        + activation * recompute.recomputes(index, "activation"))
    return Work(forward + cast.forward, 2 * forward + cast.backward, 0.0, again)


def layer_kernels(cfg: Config, index: int) -> tuple[int, int]:
    """Kernels one layer launches for one micro-batch, (forward, backward): each weight product once forward and
    twice backward (input and weight gradients; a MoE layer's experts as one grouped product), the attention core
    once forward and twice backward (its gradient and the softmax statistics), and per block the norm and the
    residual add, plus the activation, each twice backward (a norm's input and weight gradients)."""
    m = cfg.model
    products = len(layer_gemms(cfg, index))
    core = 1 if m.attention else 0
    elementwise = 2 * (1 + core) + 1
    return products + core + elementwise, 2 * (products + core + elementwise)


def head(cfg: Config) -> Work:
    """The output projection to the vocabulary (split by TP); the embedding lookup costs no FLOPs."""
    return _matmul(2 * tokens(cfg) * cfg.model.hidden * cfg.model.vocab / cfg.parallel.tp)


@dataclass(frozen=True)
class Gemm:
    """``count`` products of (m x k)·(k x n) on one GPU for one micro-batch's forward."""

    m: float
    n: float
    k: float
    count: float = 1.0
    group: str = "attention"  # attention, mla_up_proj (MLA's up-projections, part of attention), mlp, experts,
    # router, head: what precision.fp8 and recompute modules name

    @property
    def flops(self) -> float:
        return 2 * self.m * self.n * self.k * self.count


def layer_gemms(cfg: Config, index: int) -> list[Gemm]:
    """The weight matrix products of one layer's forward on one GPU: their FLOPs add up to :func:`layer` less the
    attention core (tokens are the rows; TP splits the output width of column-parallel and the input width of
    row-parallel layers; routed experts: each of the experts/ep local experts takes tokens x top-k x capacity x
    ep x etp / (experts x tp) rows, so the GPU does :func:`moe_parts`'s share)."""
    m, p, t = cfg.model, cfg.parallel, tokens(cfg)
    tp, gates = p.tp, 2 if m.gated_mlp else 1
    result = []
    if m.attention and m.mla:
        qk, v = m.hd + m.qk_rope_head_dim, m.v_head_dim or m.hd
        if m.q_lora_rank:
            result += [Gemm(t, m.q_lora_rank / tp, m.hidden),
                       Gemm(t, m.heads * qk / tp, m.q_lora_rank, group="mla_up_proj")]
        else:
            result.append(Gemm(t, m.heads * qk / tp, m.hidden))
        result += [Gemm(t, (m.kv_lora_rank + m.qk_rope_head_dim) / tp, m.hidden),
                   Gemm(t, m.heads * (m.hd + v) / tp, m.kv_lora_rank, group="mla_up_proj"),
                   Gemm(t, m.hidden, m.heads * v / tp)]
    elif m.attention:
        result += [Gemm(t, (m.heads + 2 * m.kv) * m.hd / tp, m.hidden), Gemm(t, m.hidden, m.heads * m.hd / tp)]

    def mlp_gemms(rows: float, ffn: float, group: str, count: float = 1.0) -> list[Gemm]:
        return [Gemm(rows, gates * ffn, m.hidden, count, group), Gemm(rows, m.hidden, ffn, count, group)] if ffn \
            else []

    if m.is_moe(index):
        local = m.experts / p.ep
        rows = t * m.moe_topk * m.routed_load * p.ep * p.expert_tp / (m.experts * tp)
        result += [Gemm(t, m.experts, m.hidden, group="router"),
                   *mlp_gemms(rows, m.expert_ffn / p.expert_tp, "experts", local),
                   *mlp_gemms(t, m.expert_ffn * m.shared_experts / tp, "experts")]
    else:
        result += mlp_gemms(t, m.ffn_hidden / tp, "mlp")
    return result


def head_gemms(cfg: Config) -> list[Gemm]:
    if not cfg.model.vocab:
        return []
    return [Gemm(tokens(cfg), cfg.model.vocab / cfg.parallel.tp, cfg.model.hidden, group="head")]


FP8_OF_BF16 = (1550 / 1979) / (830 / 989)  # the best FP8 GEMM's share of its peak over the best BF16 one's


def fp8_speedup(cfg: Config, gemm: Gemm) -> float:
    """How much faster this product runs than in bf16 when precision.fp8 names its group (an MLA up-projection is
    part of attention), else 1: the FP8 peak over the bf16 one, times how much less of its peak FP8 reaches. The
    best published FP8 GEMMs on Hopper reach 78% of 1979 TFLOP/s (DeepGEMM, 1550 on an H800, fine-grained
    scaling), the best bf16 ones 84% of 989 (the H200 sweep, 830): 1.87x, not 2x."""
    group = "attention" if gemm.group == "mla_up_proj" else gemm.group
    fp8 = cfg.hardware.peak_tflops_fp8
    return fp8 / cfg.hardware.peak_tflops_bf16 * FP8_OF_BF16 if fp8 and group in cfg.precision.fp8 else 1.0


def fp8_cast_traffic(cfg: Config, gemms: list[Gemm]) -> Work:
    """HBM bytes of quantizing the FP8 products' operands for one micro-batch (Transformer Engine's cast-transpose:
    read bf16, write FP8 and its transpose, 4 bytes an element): forward, each input (m x k) and the weight (k x n,
    cast once a step, so shared over the micro-batches); backward, the output gradient (m x n). DeepGEMM leaves
    casting to its caller for the same reason: it is memory-bound work outside the GEMM."""
    named = [g for g in gemms if fp8_speedup(cfg, g) > 1]
    micro = cfg.micro_batches
    return Work(sum(4 * g.count * (g.m * g.k + g.k * g.n / micro) for g in named),
                sum(4 * g.count * g.m * g.n for g in named), 0.0)


def _fp8_saving(cfg: Config, gemms: list[Gemm], recomputed: bool) -> Work:
    """The FLOPs FP8 saves on these products, as bf16-equivalent FLOPs to take off (each pass, and the recompute
    when the layer is recomputed whole)."""
    saved = sum(g.flops * (1 - 1 / fp8_speedup(cfg, g)) for g in gemms)
    return Work(-saved, -saved, -saved, -saved if recomputed else 0.0)


def gemm_times(gemms: list[Gemm], cfg: Config) -> list[Work]:
    """Seconds of each product's forward, input gradient and weight gradient: by shape on a profiled device, else
    its FLOPs at the matmul efficiency (FP8 ones at the FP8 peak)."""
    hw, profile = cfg.hardware, cfg.profile
    if profile is None:
        return [Work(*[seconds(g.flops / fp8_speedup(cfg, g), cfg)] * 3) for g in gemms]
    peak, eff, hbm = hw.peak_tflops_bf16 * 1e12, cfg.calibration.matmul_efficiency, hw.hbm_bandwidth_gb_per_s

    def one(g: Gemm, m: float, n: float, k: float) -> float:
        return g.count * hardware.gemm_seconds(m, n, k, peak, eff, hbm and hbm * 1e9, profile) / fp8_speedup(cfg, g)

    return [Work(one(g, g.m, g.n, g.k), one(g, g.m, g.k, g.n), one(g, g.k, g.n, g.m)) for g in gemms]


def gemm_seconds(gemms: list[Gemm], cfg: Config) -> Work:
    """Seconds of the products' forward, input gradient and weight gradient together."""
    return sum(gemm_times(gemms, cfg), Work(0.0, 0.0, 0.0))


def core_seconds(cfg: Config) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core from the profile's attention table (its FLOPs at
    the achieved rate for this sequence, heads and head width), or its FLOPs at the matmul efficiency."""
    m, p = cfg.model, cfg.parallel
    core = attention(cfg)[1]
    assert cfg.profile is not None
    rate = {part: cfg.profile.attention_rate(p.micro_batch * m.heads / p.tp, m.seq_len / p.cp, m.hd,
                                             m.flash_attention, part) for part in ("fwd", "bwd")}
    if rate["fwd"] is None or rate["bwd"] is None or not m.flash_attention:
        return seconds(core, cfg), seconds(2 * core, cfg)
    scale = cfg.profile.matmul_efficiency / cfg.calibration.matmul_efficiency
    return core / rate["fwd"] * scale, 2.5 * core / rate["bwd"] * scale


def layer_seconds(cfg: Config, index: int) -> Work:
    """Seconds of one layer's forward, input gradient, weight gradient and recompute for one micro-batch: FLOPs at
    the matmul efficiency plus bytes at the memory bandwidth, or with a profile, per product and per kernel size."""
    work, traffic = layer(cfg, index), layer_traffic(cfg, index)
    recompute = cfg.schedule.recompute
    if cfg.profile is None:
        if cfg.precision.fp8:
            work = work + _fp8_saving(cfg, layer_gemms(cfg, index), recompute.kind_of(index) == "full")
        return Work(*(seconds(w, cfg) + traffic_seconds(b, cfg) for w, b in
                      zip((work.forward, work.backward, work.wgrad, work.recompute),
                          (traffic.forward, traffic.backward, traffic.wgrad, traffic.recompute), strict=True)))
    weights = gemm_seconds(layer_gemms(cfg, index), cfg)
    core_f, core_b = core_seconds(cfg) if cfg.model.attention else (0.0, 0.0)
    kernel = tokens(cfg) * cfg.model.hidden * cfg.precision.activation_bytes * 2  # a layer norm's read + write
    memory = Work(*(memory_seconds(b, kernel, cfg) for b in (
        traffic.forward, traffic.backward, traffic.wgrad, traffic.recompute)))
    again = weights.forward + core_f if recompute.kind_of(index) == "full" else (
        core_f * recompute.recomputes(index, "core_attn")
        + gemm_seconds([g for g in layer_gemms(cfg, index) if g.group == "mla_up_proj"], cfg).forward
        * recompute.recomputes(index, "mla_up_proj"))
    return Work(weights.forward + core_f, weights.backward + core_b, weights.wgrad, again) + Work(
        memory.forward, memory.backward, memory.wgrad, memory.recompute)


@dataclass(frozen=True)
class CrossEntropy:
    """Bytes a logit costs the loss (the vocabulary split by TP), by how the framework computes it in fp32."""

    forward: int   # HBM bytes moved per logit, forward
    backward: int  # and backward
    held: int      # bytes per logit alive at the loss's peak


CROSS_ENTROPY = {
    # F.cross_entropy(logits.float(), y): forward casts (read 2, write 4), log-softmax reads twice (max, sum of
    # exponentials) and writes 4; backward writes the dense gradient of the log-probabilities (4), the softmax
    # gradient reads it and the kept output and writes 4, the cast back reads 4 and writes 2. At its peak the bf16
    # logits, the kept log-probabilities and both gradients are alive: 2 + 4 + 4 + 4. The h200 GPT trace: cast
    # 300 µs, log-softmax 407 µs, its gradient 442 µs a micro-batch of 2 x 1024 tokens x 50304.
    "pytorch": CrossEntropy(18, 22, 14),
    # Megatron's vocabulary-parallel loss (megatron/core/tensor_parallel/cross_entropy.py): one fp32 copy (cast:
    # 2 + 4), then max (4), subtract, exp and divide in place (8 each), sum (4); the backward multiplies the kept
    # softmax in place (8) and the cast back moves 6. The bf16 logits and the fp32 copy: 2 + 4.
    "megatron": CrossEntropy(38, 14, 6),
}


def loss_traffic(cfg: Config) -> Work:
    """HBM bytes of the cross-entropy over one micro-batch's logits on one GPU: ``model.cross_entropy``'s bytes per
    logit. With a 128k vocabulary it is several milliseconds a micro-batch, which small models feel."""
    logits = tokens(cfg) * cfg.model.vocab / cfg.parallel.tp
    kind = CROSS_ENTROPY[cfg.model.cross_entropy]
    return Work(kind.forward * logits, kind.backward * logits, 0.0)


def head_seconds(cfg: Config) -> Work:
    """The output layer and its loss for one micro-batch (nothing without a vocabulary: ``model.vocab: 0``)."""
    if not cfg.model.vocab:
        return Work(0.0, 0.0, 0.0)
    loss = loss_traffic(cfg) + fp8_cast_traffic(cfg, head_gemms(cfg))
    logits = 4 * tokens(cfg) * cfg.model.vocab / cfg.parallel.tp  # one fp32 pass over them: each kernel's size
    loss_s = Work(memory_seconds(loss.forward, logits, cfg), memory_seconds(loss.backward, logits, cfg), 0.0)
    head_flops = head(cfg) + _fp8_saving(cfg, head_gemms(cfg), False)
    if cfg.profile is None:
        return loss_s + Work(*(seconds(x, cfg) for x in (head_flops.forward, head_flops.backward, head_flops.wgrad)))
    return loss_s + gemm_seconds(head_gemms(cfg), cfg)


def accumulation_seconds(cfg: Config, params: float, largest: float) -> float:
    """Adding one micro-batch's weight gradients into the accumulated ones (read both, write one, per parameter),
    which eager PyTorch's AccumulateGrad does for every micro-batch after the first; none with
    ``model.gradient_accumulation_fusion`` (Megatron: the weight-gradient GEMM accumulates into main_grad itself).
    ``largest`` is the biggest tensor's parameter count, for the bandwidth a kernel of its size reaches."""
    if cfg.model.gradient_accumulation_fusion:
        return 0.0
    size = 3 * cfg.precision.grad_bytes
    return memory_seconds(size * params, size * largest, cfg)


def seconds(flops: float, cfg: Config) -> float:
    return flops / (cfg.hardware.peak_tflops_bf16 * 1e12 * cfg.calibration.matmul_efficiency)


def memory_seconds(nbytes: float, kernel_bytes: float, cfg: Config) -> float:
    """Seconds to move ``nbytes`` through HBM in kernels of ``kernel_bytes`` each: at the profile's measured rate for
    that size (scaled, as GEMMs are, when calibration.memory_efficiency differs from the profile's own), else the
    data sheet's bandwidth x calibration.memory_efficiency."""
    profile = cfg.profile
    rate = profile.memory_rate(kernel_bytes) if profile else None
    if not rate or profile is None:
        return traffic_seconds(nbytes, cfg)
    return nbytes / rate * profile.memory_efficiency / cfg.calibration.memory_efficiency


def traffic_seconds(nbytes: float, cfg: Config) -> float:
    """Memory-bound time; zero when the hardware section gives no hbm_bandwidth_gb_per_s."""
    hbm = cfg.hardware.hbm_bandwidth_gb_per_s
    return nbytes / (hbm * 1e9 * cfg.calibration.memory_efficiency) if hbm else 0.0
