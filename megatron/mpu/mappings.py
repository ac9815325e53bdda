"""Autograd-aware communication over the tensor-model-parallel group.

Each function is the identity when TP=1, so the TP=1 model runs no collective at all.
"""
from typing import Any

import torch
import torch.distributed as dist

from .parallel_state import get_tensor_model_parallel_group, get_tensor_model_parallel_world_size
from .shm_comm import tensor_model_parallel_all_reduce


def _reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over the TP group, in place: the partial sums (a row-parallel output, a gradient) are
    this function's to overwrite, so no copy (the forward marks its input dirty, so autograd
    refuses if anything else had saved it)."""
    if get_tensor_model_parallel_world_size() == 1:
        return x
    if not x.is_contiguous():
        x = x.contiguous()
    return tensor_model_parallel_all_reduce(x, dist.ReduceOp.SUM, get_tensor_model_parallel_group())


def _gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def _split_last_dim(x: torch.Tensor) -> torch.Tensor:
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    rank = dist.get_rank(group=get_tensor_model_parallel_group())
    return x.chunk(world, dim=-1)[rank].contiguous()


class _CopyToModelParallelRegion(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce (each TP rank used the full input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _reduce(grad)


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """Forward: all-reduce partial sums. Backward: identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        reduced = _reduce(x)
        if reduced is x and get_tensor_model_parallel_world_size() > 1:
            ctx.mark_dirty(x)
        return reduced

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """Forward: concatenate the last-dim slices. Backward: keep our slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _gather_last_dim(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _split_last_dim(grad)


def copy_to_tensor_model_parallel_region(x: torch.Tensor) -> torch.Tensor:
    return _CopyToModelParallelRegion.apply(x)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor) -> torch.Tensor:
    return _ReduceFromModelParallelRegion.apply(x)


def gather_from_tensor_model_parallel_region(x: torch.Tensor) -> torch.Tensor:
    return _GatherFromModelParallelRegion.apply(x)
