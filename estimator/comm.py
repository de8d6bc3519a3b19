"""Communication per parallel dimension: payloads from tensor shapes, times from an alpha-beta model per network level.

Payloads follow seed 002: a TP collective moves activations (tokens x hidden x dtype), never parameter bytes; EP
moves the routed tokens (tokens x top-k x hidden); PP the boundary activation; DP the gradients of the parameters a
GPU holds. Times use the NCCL-tests bus-bandwidth factors (all-reduce 2(n-1)/n, reduce-scatter / all-gather /
all-to-all (n-1)/n) against the bus bandwidth of the group (NVLink in a node; across nodes, one NIC per rank, so
the NICs of the group's ranks on a node together), plus a latency per ring step (Thakur et al. 2005) or tree
level. ``bandwidth_gb_per_s.inter`` is one NIC's. Every function returns seconds: a byte count is never added to
a time (seed 000, P4).

Where a group sits comes from the layout (Megatron RankGenerator order, traceana.layout): consecutive ranks fill a
node of ``devices_per_node`` first, so a dimension's stride in the order decides whether it crosses nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from traceana.estimator.compute import tokens
from traceana.estimator.config import Config, Parallel


@dataclass(frozen=True)
class Span:
    """One group of a dimension: its size, how many nodes it spans, and how many of its ranks share a node."""

    size: int
    nodes: int

    @property
    def per_node(self) -> int:
        return self.size // self.nodes


@lru_cache(maxsize=4096)
def _span(p: Parallel, per_node: int, dims: tuple[str, ...], expert: bool,
          limit: tuple[tuple[str, tuple[int, int]], ...]) -> Span:
    if expert:
        sizes = {"tp": p.expert_tp, "ep": p.ep, "dp": p.layout.edp, "pp": p.pp}
        names = [n for n in p.order.split("-") if n != "cp"]
    else:
        sizes = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
        names = [n for n in p.order.split("-") if n != "ep"]
    strides, acc = {}, 1
    for name in names:
        strides[name] = acc
        acc *= sizes[name]
    narrowed = dict(limit)
    ranks = [0]
    for dim in (d for d in dims if d in strides):  # a dim the order leaves out has size 1
        step, count = narrowed.get(dim, (1, sizes[dim]))
        ranks = [r + i * step * strides[dim] for r in ranks for i in range(count)]
    return Span(len(ranks), len({r // per_node for r in ranks}))


def span(cfg: Config, dims: tuple[str, ...], expert: bool = False, **limit: tuple[int, int]) -> Span:
    """Where the group over ``dims`` containing rank 0 sits (all groups of a dim are alike for power-of-two sizes).

    Dense groups use the order without ep; expert groups (ep, etp, edp) the order without cp, as Megatron-Core's
    second RankGenerator does (traceana.layout.Layout.groups builds the same sets). ``limit`` narrows a dim to
    (step, count): every step-th of its ranks, count of them (ZeRO-3 shard and HSDP replica groups).
    """
    return _span(cfg.parallel, cfg.hardware.devices_per_node, dims, expert, tuple(sorted(limit.items())))


def bus_bandwidth(where: Span, cfg: Config) -> float:
    """Bytes/s of bus bandwidth a ring or tree collective over ``where`` reaches: NVLink inside a node; across nodes
    each rank drives its own NIC (one per GPU, rail-optimized as in DGX / HGX systems), and NCCL runs one channel
    per NIC, so a node moves ``per_node`` NICs' worth and the group's bus bandwidth is per_node x the NIC bandwidth,
    capped by NVLink. Published nccl-tests agree: 8 A100 + 4 HDR NICs a node (100 GB/s a node) measure 84.8 GB/s
    average and 96 peak on 3 nodes (NVIDIA/nccl-tests#119), 86 GB/s on 2 (NVIDIA/nccl-tests#175, where the same
    node measures 232.5 GB/s alone); a single NIC reaches its 24 GB/s line rate."""
    hw = cfg.hardware.bandwidth_gb_per_s
    if where.nodes == 1:
        return hw.intra * 1e9
    return min(hw.intra, where.per_node * hw.inter) * 1e9


def collective(op: str, nbytes: float, where: Span, cfg: Config) -> float:
    """Seconds for one collective of ``nbytes`` (the full buffer; a rank's total send for all-to-all).

    Ring (Thakur et al. 2005): all-reduce 2(n-1)/n x S at the bus bandwidth plus 2(n-1) latency steps, reduce-scatter
    and all-gather half of that; across nodes an all-reduce may instead take NCCL's double binary tree between
    nodes with a chain inside each, 2 x (log2(nodes) inter-node + (per_node - 1) NVLink) latencies, same bandwidth:
    NCCL picks the faster. An all-to-all sends (per_node - 1)/n of the buffer over NVLink and (n - per_node)/n
    through the rank's own NIC, the slower of the two bounding it.

    gloo (``hardware.collectives: gloo``) has no reduce-scatter: torch's ProcessGroupGloo runs it as an all-reduce
    of the whole input and keeps its chunk (sample_traces/README.md), so it costs a whole all-reduce."""
    n = where.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if op == "reduce_scatter" and cfg.hardware.collectives == "gloo":
        op = "all_reduce"
    hw = cfg.hardware
    inter = where.nodes > 1
    alpha = (hw.latency_us.inter if inter else hw.latency_us.intra) * 1e-6
    bw = bus_bandwidth(where, cfg)
    if op == "all_reduce":
        ring = 2 * (n - 1) * alpha
        tree = 2 * (math.ceil(math.log2(where.nodes)) * alpha + (where.per_node - 1) * hw.latency_us.intra * 1e-6)
        return 2 * (n - 1) / n * nbytes / bw + (min(ring, tree) if inter else ring)
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) / n * nbytes / bw + (n - 1) * alpha
    if op == "all_to_all":
        eff = cfg.calibration.a2a_efficiency
        intra = nbytes * (where.per_node - 1) / n / (hw.bandwidth_gb_per_s.intra * 1e9 * eff.intra)
        inter_s = nbytes * (n - where.per_node) / n / (hw.bandwidth_gb_per_s.inter * 1e9 * eff.inter)
        return max(intra, inter_s) + (n - 1) * alpha
    raise ValueError(f"unknown collective {op!r}")


def p2p(nbytes: float, inter_node: bool, cfg: Config) -> float:
    level = "inter" if inter_node else "intra"
    return nbytes / (getattr(cfg.hardware.bandwidth_gb_per_s, level) * 1e9) + getattr(cfg.hardware.latency_us,
                                                                                     level) * 1e-6


@dataclass(frozen=True)
class Pass:
    """Seconds of communication in one forward and one backward of a micro-batch through a piece of the model."""

    forward: float = 0.0
    backward: float = 0.0

    def __add__(self, other: Pass) -> Pass:
        return Pass(self.forward + other.forward, self.backward + other.backward)

    def __mul__(self, k: float) -> Pass:
        return Pass(self.forward * k, self.backward * k)


def _activation_bytes(cfg: Config) -> float:
    """One micro-batch's hidden states on one GPU: tokens x hidden x dtype (the TP and PP payload, seed 002)."""
    return tokens(cfg) * cfg.model.hidden * cfg.precision.activation_bytes


def tp_layer(cfg: Config, moe: bool) -> Pass:
    """Megatron TP: a row-parallel all-reduce after attention and after the MLP forward, and the column-parallel
    input-gradient all-reduces in the backward; with sequence parallelism each becomes reduce-scatter + all-gather,
    the same bus volume on NCCL (more on gloo, see :func:`collective`). A MoE block reduces over the expert-TP group
    instead."""
    payload, where = _activation_bytes(cfg), span(cfg, ("tp",))
    dense = (collective("reduce_scatter", payload, where, cfg) + collective("all_gather", payload, where, cfg)
             if cfg.parallel.sequence_parallel else collective("all_reduce", payload, where, cfg))
    attn = dense if cfg.model.attention else 0.0
    ffn = collective("all_reduce", payload, span(cfg, ("tp",), expert=moe), cfg) if moe else dense
    return Pass(attn + ffn, attn + ffn)


def tp_embedding_head(cfg: Config) -> tuple[Pass, Pass]:
    """Vocabulary-parallel embedding (an all-reduce forward) and output layer (input-gradient all-reduce backward).
    With sequence parallelism (Megatron-Core) the embedding reduce-scatters its output into the sequence shards
    and the output layer all-gathers its input forward and reduce-scatters that gradient backward."""
    if not cfg.model.vocab:
        return Pass(), Pass()
    payload, where = _activation_bytes(cfg), span(cfg, ("tp",))
    if cfg.parallel.sequence_parallel:
        scatter = collective("reduce_scatter", payload, where, cfg)
        return Pass(scatter, 0.0), Pass(collective("all_gather", payload, where, cfg), scatter)
    one = collective("all_reduce", payload, where, cfg)
    return Pass(one, 0.0), Pass(0.0, one)


def cp_layer(cfg: Config) -> Pass:
    """Context parallelism in attention: ring passes K/V around (cp-1 steps forward, K/V and their gradients
    backward), all-gather gathers K/V (reduce-scatters their gradients), Ulysses all-to-alls Q, K, V and the output
    between sequence and head sharding both ways."""
    p, m = cfg.parallel, cfg.model
    if p.cp <= 1 or not m.attention:
        return Pass()
    where = span(cfg, ("cp",))
    width = 2 * max(1, m.kv // p.tp) * m.hd if not m.mla else m.heads * (2 * m.hd + m.qk_rope_head_dim) / p.tp
    kv_bytes = tokens(cfg) * width * cfg.precision.activation_bytes  # this rank's K and V
    if p.cp_algo == "ring":
        step = p2p(kv_bytes, where.nodes > 1, cfg)
        return Pass((p.cp - 1) * step, 2 * (p.cp - 1) * step)
    if p.cp_algo == "allgather":
        return Pass(collective("all_gather", kv_bytes * p.cp, where, cfg),
                    collective("reduce_scatter", kv_bytes * p.cp, where, cfg))
    q_width = 2 * m.heads * m.hd / p.tp
    a2a = collective("all_to_all", tokens(cfg) * (q_width + width) * cfg.precision.activation_bytes, where, cfg)
    return Pass(a2a, a2a)


def ep_layer(cfg: Config) -> Pass:
    """Dispatch and combine all-to-alls of one MoE layer, forward and again backward. A rank sends its tokens x top-k
    copies x hidden (the capacity factor pads them; under dropless routing the most loaded EP rank receives
    model.routed_load x its balanced share, and that paces the exchange); with sequence parallelism its tokens are
    1/tp of the sequence.
    When the experts run in FP8 the forward dispatch sends FP8 (1 byte; DeepSeek-V3 §3.3.2), the combine and the
    backward's gradients stay in the activation precision."""
    p, m = cfg.parallel, cfg.model
    if p.ep <= 1:
        return Pass()
    local = tokens(cfg) / (p.tp if p.sequence_parallel else 1)
    elements = local * m.moe_topk * m.routed_load * m.hidden
    where = span(cfg, ("ep",), expert=True)

    def a2a(element_bytes: float) -> float:
        if m.moe_max_nodes is None or where.nodes == 1:
            return collective("all_to_all", elements * element_bytes, where, cfg)
        return _node_limited(cfg, local * m.hidden * element_bytes, where)

    one = a2a(cfg.precision.activation_bytes)
    dispatch = a2a(1) if "experts" in cfg.precision.fp8 else one
    return Pass(dispatch + one, 2 * one)


def _node_limited(cfg: Config, token_bytes: float, where: Span) -> float:
    """An all-to-all under node-limited routing (DeepSeek-V3 §3.2.2, M = model.moe_max_nodes): a token's copies
    bound for one node cross the network once, through the sender's NIC, and NVLink forwards them to the experts'
    GPUs; its experts lie on at most M of the group's nodes (each a remote one with probability (nodes-1)/nodes)."""
    m, hw, eff = cfg.model, cfg.hardware, cfg.calibration.a2a_efficiency
    assert m.moe_max_nodes is not None
    remote = min(m.moe_max_nodes, m.moe_topk, where.nodes) * (where.nodes - 1) / where.nodes
    inter = token_bytes * remote / (hw.bandwidth_gb_per_s.inter * 1e9 * eff.inter)
    intra = token_bytes * m.moe_topk * m.routed_load * (where.per_node - 1) / where.per_node / (
        hw.bandwidth_gb_per_s.intra * 1e9 * eff.intra)
    return max(inter, intra) + (where.size - 1) * hw.latency_us.inter * 1e-6


def pp_p2p(cfg: Config) -> float:
    """Seconds to send one micro-batch's boundary activation (or its gradient) to the next stage."""
    p = cfg.parallel
    if p.pp <= 1:
        return 0.0
    payload = _activation_bytes(cfg) / (p.tp if p.sequence_parallel else 1)
    return p2p(payload, span(cfg, ("pp",)).nodes > 1, cfg)


@dataclass(frozen=True)
class GradSync:
    """Seconds of one stage's once-a-step data-parallel traffic: gradient reduction and (ZeRO) parameter gather."""

    reduce: float
    gather: float


def dp_step(cfg: Config, dense_params: float, expert_params: float) -> GradSync:
    """Gradients of the parameters one GPU holds (dense over dp x cp, experts over expert-dp), once a step.

    ZeRO 0 all-reduces them; ZeRO 1/2 reduce-scatter them and all-gather the updated bf16 parameters; ZeRO-3 moves
    parameters per layer (see :func:`zero3_layer`) and here only all-reduces across HSDP replicas.
    """
    p, prec = cfg.parallel, cfg.precision
    dense, expert = span(cfg, ("dp", "cp")), span(cfg, ("dp",), expert=True)
    if p.zero == 3:
        replicas = p.dp // (p.zero_shard or p.dp)
        if replicas <= 1:
            return GradSync(0.0, 0.0)
        shard = p.zero_shard or p.dp
        replica_span = span(cfg, ("dp",), dp=(shard, replicas))
        return GradSync(collective("all_reduce", dense_params / (shard * p.cp) * prec.grad_bytes, replica_span, cfg),
                        0.0)
    op = "all_reduce" if p.zero == 0 else "reduce_scatter"
    reduce = (collective(op, dense_params * prec.grad_bytes, dense, cfg)
              + collective(op, expert_params * prec.grad_bytes, expert, cfg))
    if p.zero == 0:
        return GradSync(reduce, 0.0)
    gather = (collective("all_gather", dense_params * prec.param_bytes, dense, cfg)
              + collective("all_gather", expert_params * prec.param_bytes, expert, cfg))
    return GradSync(reduce, gather)


def zero3_layer(cfg: Config, params: float) -> Pass:
    """ZeRO-3 / FSDP for one layer of ``params`` (per GPU before sharding): gather it for the forward, gather it
    again and reduce-scatter its gradient in the backward, over the shard group."""
    p = cfg.parallel
    if p.zero != 3:
        return Pass()
    where = span(cfg, ("dp", "cp"), dp=(1, p.zero_shard or p.dp))
    gather = collective("all_gather", params * cfg.precision.param_bytes, where, cfg)
    return Pass(gather, gather + collective("reduce_scatter", params * cfg.precision.grad_bytes, where, cfg))
