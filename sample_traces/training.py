"""The parts of a training step that are not the model: data-parallel gradient sync and the optimizer."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_gradients(params: list[torch.Tensor], group: dist.ProcessGroup, bucket: bool,
                         payload: float = 1.0) -> None:
    """Data-parallel gradient sync: one AllReduce per parameter, or one over a flat bucket of all of them (as DDP
    does when the model fits one bucket). Averages, so replicas stay equal. ``payload`` < 1 (bucket only) reduces
    just the bucket's first fraction, a timing knob (the validation pairs' halved payload), not training."""
    grads = [p.grad for p in params if p.grad is not None]
    size = dist.get_world_size(group)
    if bucket:
        flat = torch.cat([g.reshape(-1) for g in grads])
        part = flat[:round(flat.numel() * payload)]
        dist.all_reduce(part, group=group)
        part /= size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    else:
        for g in grads:
            dist.all_reduce(g, group=group)
            g /= size


def sgd(params: list[torch.Tensor], lr: float = 1e-3) -> None:
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None
