"""Autograd-aware tensor-parallel communication, as Megatron-LM's tensor_parallel/mappings.py defines it.

torch.distributed.nn.functional.all_gather's backward is an all-to-all plus a sum on gloo (a ReduceScatter only on
NCCL), which is not what a sequence-parallel layer does on a GPU; these functions give every backend the pairing that
Megatron and seed 002 rely on: AllReduce <-> identity, ReduceScatter <-> AllGather along the sequence (first) dim.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Function


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=group)
    return out


def _reduce_scatter(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=group)
    return out


class _CopyToRegion(Function):
    """Megatron's f: identity forward, AllReduce of the input gradient backward (column-parallel input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _all_reduce(grad, ctx.group), None


class _ReduceFromRegion(Function):
    """Megatron's g: AllReduce forward (row-parallel partial sums), identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


class _ReduceScatterToSequence(Function):
    """ReduceScatter along dim 0 forward (row-parallel output into sequence shards), AllGather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _all_gather(grad, ctx.group), None


class _GatherFromSequence(Function):
    """AllGather along dim 0 forward (sequence shards to the full tensor), ReduceScatter backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _reduce_scatter(grad, ctx.group), None


def copy_to_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return _CopyToRegion.apply(x, group)


def reduce_from_region(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return _ReduceFromRegion.apply(x, group)


def reduce_scatter_to_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return _ReduceScatterToSequence.apply(x, group)


def gather_from_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return _GatherFromSequence.apply(x, group)
