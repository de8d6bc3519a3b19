"""Seed 002's two-stage pipeline, GPipe fill-drain: all forward micro-batches, then all backward in reverse order.

Global batch 64 per pipeline, fp32: stage 0 computes H = GELU(X W0^T) with W0 [1024, 512] and sends H [mb, 1024];
stage 1 receives H as a fresh autograd leaf, computes Y = H W1^T with W1 [512, 1024] and an MSE loss, and sends
dH back; stage 0 continues its own graph with it. Plain dist.send / dist.recv (blocking) over the PP group.
Per rank per step: mb activation messages + mb gradient messages (pp2_mb1: 2, pp2_mb4: 8, pp2_mb8: 16; 256 KiB in
total each way), then 1 DP AllReduce of the stage's single 2 MiB weight gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import Context, StepFn
from training import all_reduce_gradients, sgd

D_IN, HIDDEN, BATCH = 512, 1024, 64


def build(ctx: Context, micro_batches: int, d_in: int = D_IN, hidden: int = HIDDEN, batch: int = BATCH) -> StepFn:
    """The pipeline at ``micro_batches``; the validation pairs (pairs.py) also vary the widths and the batch."""
    pp_group, dp_group = ctx.groups["PP"], ctx.groups["DP"]
    stage = ctx.coords["pp"]
    peer = ctx.ranks["PP"][1 - stage]
    mb = batch // micro_batches
    weights = torch.Generator().manual_seed(0)
    w0 = torch.randn(hidden, d_in, generator=weights) / d_in**0.5
    w1 = torch.randn(d_in, hidden, generator=weights) / hidden**0.5
    weight = (w0 if stage == 0 else w1).clone().requires_grad_()
    data = torch.Generator().manual_seed(100 + ctx.coords["dp"])  # both stages of a pipeline draw the same batch

    def step() -> None:
        x, target = torch.randn(batch, d_in, generator=data), torch.randn(batch, d_in, generator=data)
        order = range(micro_batches)
        if stage == 0:
            outputs = []
            for i in order:  # fill
                h = F.gelu(F.linear(x[i * mb:(i + 1) * mb], weight))
                dist.send(h.detach(), dst=peer, group=pp_group)
                outputs.append(h)
            for i in reversed(order):  # drain
                grad = torch.empty(mb, hidden)
                dist.recv(grad, src=peer, group=pp_group)
                outputs[i].backward(grad)
        else:
            inputs, losses = [], []
            for i in order:
                h = torch.empty(mb, hidden)
                dist.recv(h, src=peer, group=pp_group)
                h.requires_grad_(True)  # plain P2P cuts the autograd graph: a new leaf on this stage
                inputs.append(h)
                losses.append(F.mse_loss(F.linear(h, weight), target[i * mb:(i + 1) * mb]) / micro_batches)
            for i in reversed(order):
                losses[i].backward()
                dist.send(inputs[i].grad, dst=peer, group=pp_group)
        all_reduce_gradients([weight], dp_group, bucket=False)
        sgd([weight])

    return step


def build_mb1(ctx: Context) -> StepFn:
    return build(ctx, micro_batches=1)


def build_mb4(ctx: Context) -> StepFn:
    return build(ctx, micro_batches=4)


def build_mb8(ctx: Context) -> StepFn:
    return build(ctx, micro_batches=8)
