"""Seed 002's tensor-parallel two-layer MLP on TP2 x DP2: Y = GELU(X W1^T) W2^T, D=512, H=1024, B=128, fp32.

W1 is column-parallel (split on dim 0), W2 row-parallel (split on dim 1), so each TP rank holds a partial Y.
- tp2dp2_mlp: partial -> replicated Y with an autograd AllReduce (torch.distributed.nn.functional.all_reduce, whose
  backward is again an AllReduce): 1 forward + 1 backward TP AllReduce per step.
- tp2dp2_mlp_sp: partial -> sequence shard with ReduceScatter, then AllGather back to a replicated loss; the autograd
  duals add 1 AllGather + 1 ReduceScatter backward: 2 RS + 2 AG per step.
Both then AllReduce the two weight-shard gradients (1 MiB each) over the DP group, one call per weight: 2 DP AllReduce.
- tp2dp2_mlp_b256: tp2dp2_mlp on 256 tokens instead of 128 (twice the sequence): TP messages double, DP's do not.
- tp2dp2_mlp_b512: on 512 tokens the TP AllReduce ([512, 512] fp32) is 1 MiB, the size of each DP one: sizes tie.
The validation pairs (pairs.py) build the same MLP at other widths (H = 2D) and token counts, with the gradients as
one flat DP bucket; on a one-rank TP group (dp2) the partial output is already whole and no TP call is made.
"""

from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from harness import Context, StepFn
from mappings import gather_from_sequence, reduce_scatter_to_sequence
from training import all_reduce_gradients, sgd

D_MODEL, HIDDEN, BATCH = 512, 1024, 128


def build(ctx: Context, sequence_parallel: bool, batch: int = BATCH, d_model: int = D_MODEL, hidden: int = HIDDEN,
          bucket: bool = False, payload: float = 1.0) -> StepFn:
    tp_group, dp_group = ctx.groups["TP"], ctx.groups["DP"]
    tp_size, tp_rank = ctx.layout.tp, ctx.coords["tp"]
    weights = torch.Generator().manual_seed(0)  # same full weights on every rank, then sharded
    w1_full = torch.randn(hidden, d_model, generator=weights) / d_model**0.5
    w2_full = torch.randn(d_model, hidden, generator=weights) / hidden**0.5
    w1 = w1_full.chunk(tp_size, dim=0)[tp_rank].clone().requires_grad_()
    w2 = w2_full.chunk(tp_size, dim=1)[tp_rank].clone().requires_grad_()
    data = torch.Generator().manual_seed(100 + ctx.coords["dp"])  # one batch stream per DP replica

    def forward(x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(F.gelu(F.linear(x, w1)), w2)
        if sequence_parallel:
            return gather_from_sequence(reduce_scatter_to_sequence(partial, tp_group), tp_group)
        return dist_nn.all_reduce(partial, group=tp_group) if tp_size > 1 else partial

    # Seed 002's acceptance check, before anything is profiled: the sharded MLP equals the unsharded one.
    x = torch.randn(BATCH, d_model, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = F.linear(F.gelu(F.linear(x, w1_full)), w2_full)
    error = (forward(x).detach() - reference).abs().max().item()
    if error > 2e-5:
        raise RuntimeError(f"rank {ctx.rank}: sharded MLP differs from the full one by {error:.3g}")

    def step() -> None:
        x = torch.randn(batch, d_model, generator=data)
        forward(x).square().mean().backward()
        all_reduce_gradients([w1, w2], dp_group, bucket, payload)
        sgd([w1, w2])

    return step


def build_allreduce(ctx: Context) -> StepFn:
    return build(ctx, sequence_parallel=False)


def build_allreduce_b256(ctx: Context) -> StepFn:
    return build(ctx, sequence_parallel=False, batch=256)


def build_allreduce_b512(ctx: Context) -> StepFn:
    return build(ctx, sequence_parallel=False, batch=512)


def build_sequence_parallel(ctx: Context) -> StepFn:
    return build(ctx, sequence_parallel=True)
