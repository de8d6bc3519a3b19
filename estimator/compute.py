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
"""

from __future__ import annotations

from dataclasses import dataclass

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
    1/(tp·cp) of a replica's tokens x top-k expert passes, whatever ep and etp are; the capacity factor pads it.
    """
    m = cfg.model
    routed = mlp(cfg, m.expert_ffn) * m.moe_topk * m.capacity_factor
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
    kind = cfg.schedule.recompute.kind_of(index)
    again = weights + core if kind == "full" else core if kind == "selective" else 0.0
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
    replicated = blocks * (2 * a + 3 * a + 1)
    rows = replicated * t * m.hidden / (p.tp if p.sequence_parallel else 1)
    ffn = m.expert_ffn * (m.moe_topk * m.capacity_factor + m.shared_experts) if m.is_moe(index) else m.ffn_hidden
    activation = (3 if m.gated_mlp else 2) * a * t * ffn / p.tp  # SwiGLU reads gate and up, writes the product
    scores = 0.0 if m.flash_attention or not m.attention else (6 * a + 1) * t * m.seq_len * m.heads / p.tp
    forward = rows + activation + scores
    kind = cfg.schedule.recompute.kind_of(index)
    again = forward if kind == "full" else scores if kind == "selective" else 0.0
    return Work(forward, 2 * forward, 0.0, again)


def head(cfg: Config) -> Work:
    """The output projection to the vocabulary (split by TP); the embedding lookup costs no FLOPs."""
    return _matmul(2 * tokens(cfg) * cfg.model.hidden * cfg.model.vocab / cfg.parallel.tp)


def seconds(flops: float, cfg: Config) -> float:
    return flops / (cfg.hardware.peak_tflops_bf16 * 1e12 * cfg.calibration.matmul_efficiency)


def traffic_seconds(nbytes: float, cfg: Config) -> float:
    """Memory-bound time; zero when the hardware section gives no hbm_bandwidth_gb_per_s."""
    hbm = cfg.hardware.hbm_bandwidth_gb_per_s
    return nbytes / (hbm * 1e9 * cfg.calibration.memory_efficiency) if hbm else 0.0
