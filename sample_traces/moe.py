"""Seed 002's top-1 MoE dispatch / combine over EP groups of 2, with balanced and 7:1 skewed routing.

Each rank is a token source with 64 tokens x 512 fp32 and owns one expert (a 512 -> 2048 -> 512 GELU FFN).
Routing is deterministic top-1: the first split[0] tokens go to EP rank 0's expert, the rest to EP rank 1's.
- balanced: input splits [32, 32]: each expert receives 64 tokens.
- skewed: input splits [56, 8]: EP rank 0's expert (global ranks 0 and 2) receives 112 tokens, EP rank 1's 16 (7:1),
  and its FFN really computes on 7x the tokens, so the hot ranks are real stragglers.
Dispatch and combine are autograd all_to_all_single with variable splits; the tokens require grad (seed 002's fix),
so backward runs both reverse all-to-alls: 4 AllToAll per rank per step. The expert's two weight gradients go to
the expert-data-parallel group (same expert, other replica) as one flat bucket: 1 AllReduce per step.
"""

from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from harness import Context, StepFn
from training import all_reduce_gradients, sgd

D_MODEL, FFN, TOKENS = 512, 2048, 64


def _expert_weights(expert: int, ffn: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(expert)  # replicas of one expert start equal
    return torch.randn(ffn, D_MODEL, generator=gen) / D_MODEL**0.5, torch.randn(D_MODEL, ffn, generator=gen) / ffn**0.5


def _ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1)), w2)


def build(ctx: Context, input_splits: list[int], ffn: int = FFN) -> StepFn:
    """The MoE with these splits; the validation pairs (pairs.py) also vary the expert's width ``ffn``."""
    ep_group, edp_group = ctx.groups["EP"], ctx.groups["DP-EP"]
    ep_rank, ep_size = ctx.coords["ep"], ctx.layout.ep
    w1, w2 = (w.requires_grad_() for w in _expert_weights(ep_rank, ffn))
    # Every source routes the same way, so this expert receives input_splits[ep_rank] tokens from each source.
    output_splits = [input_splits[ep_rank]] * ep_size
    data = torch.Generator().manual_seed(100 + ctx.rank)

    def moe(x: torch.Tensor) -> torch.Tensor:
        received = dist_nn.all_to_all_single(
            x.new_empty(sum(output_splits), D_MODEL), x, output_split_sizes=output_splits,
            input_split_sizes=input_splits, group=ep_group)
        expert_out = _ffn(received, w1, w2)
        return dist_nn.all_to_all_single(
            x.new_empty(TOKENS, D_MODEL), expert_out, output_split_sizes=input_splits,
            input_split_sizes=output_splits, group=ep_group)

    # Acceptance check before profiling: every token comes back processed by the expert it was routed to.
    x = torch.randn(TOKENS, D_MODEL, generator=torch.Generator().manual_seed(7 + ctx.rank))
    with torch.no_grad():
        reference = torch.cat([_ffn(part, *_expert_weights(e, ffn)) for e, part in enumerate(x.split(input_splits))])
    error = (moe(x).detach() - reference).abs().max().item()
    if error > 2e-5:
        raise RuntimeError(f"rank {ctx.rank}: MoE output differs from the per-expert reference by {error:.3g}")

    def step() -> None:
        x = torch.randn(TOKENS, D_MODEL, generator=data, requires_grad=True)  # an upstream activation
        moe(x).square().mean().backward()
        if x.grad is None or not torch.isfinite(x.grad).all():
            raise RuntimeError(f"rank {ctx.rank}: no finite gradient reached the MoE input")
        all_reduce_gradients([w1, w2], edp_group, bucket=True)
        sgd([w1, w2])

    return step


def build_balanced(ctx: Context) -> StepFn:
    return build(ctx, [32, 32])


def build_skewed(ctx: Context) -> StepFn:
    return build(ctx, [56, 8])
