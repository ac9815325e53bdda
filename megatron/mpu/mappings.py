"""Autograd-aware communication over the tensor-model-parallel group.

Each function is the identity when TP=1, so the TP=1 model runs no collective at all.
The sequence-parallel ones (--sequence-parallel) cut or join activations [s, b, h] along the
sequence (dim 0): all_gather_single / reduce_scatter_single on the contiguous tensor are
exactly a concatenation / a sum-then-split along dim 0 (on CPU at TP 2 through shared memory,
megatron/mpu/shm_comm.py, as the all-reduces).
"""
from typing import Any

import torch
import torch.distributed as dist

from .parallel_state import get_tensor_model_parallel_group, get_tensor_model_parallel_world_size
from .shm_comm import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_reduce_scatter,
)


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
    return torch.cat(_all_gather(x.contiguous(), world), dim=-1)


@torch.compiler.disable  # --torch-compile: a collective stays eager (a graph break)
def _all_gather(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=get_tensor_model_parallel_group())
    return parts


def _split_last_dim(x: torch.Tensor) -> torch.Tensor:
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    rank = dist.get_rank(group=get_tensor_model_parallel_group())
    return x.chunk(world, dim=-1)[rank].contiguous()


def _gather_first_dim(x: torch.Tensor) -> torch.Tensor:
    """[s/tp, ...] on every rank -> [s, ...], rank r's part at r * s/tp."""
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    x = x.contiguous()
    out = torch.empty((world * x.size(0), *x.shape[1:]), dtype=x.dtype, device=x.device)
    return tensor_model_parallel_all_gather(x, out, get_tensor_model_parallel_group())


def _reduce_scatter_first_dim(x: torch.Tensor) -> torch.Tensor:
    """[s, ...] partial sums on every rank -> this rank's [s/tp, ...] part of their sum."""
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    x = x.contiguous()
    out = torch.empty((divide_sequence(x.size(0), world), *x.shape[1:]), dtype=x.dtype, device=x.device)
    return tensor_model_parallel_reduce_scatter(x, out, get_tensor_model_parallel_group())


def _split_first_dim(x: torch.Tensor) -> torch.Tensor:
    world = get_tensor_model_parallel_world_size()
    if world == 1:
        return x
    rank = dist.get_rank(group=get_tensor_model_parallel_group())
    # a copy: a dim-0 chunk is a contiguous view, and the norm that saves it would keep the whole
    # sequence's storage alive (found by the measured memory report)
    return x.chunk(world, dim=0)[rank].clone(memory_format=torch.contiguous_format)


def divide_sequence(s: int, world: int) -> int:
    # arguments.py refuses a --seq-length that TP does not divide; this guards direct callers
    if s % world:
        raise ValueError(f"sequence length {s} is not divisible by the tensor-parallel size {world}")
    return s // world


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


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Forward: keep this rank's sequence shard of a replicated [s, b, h]. Backward: all-gather
    the shards' gradients (each rank's part of the full input's gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _split_first_dim(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _gather_first_dim(grad)


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Forward: sum the partial [s, b, h] of the TP ranks and keep this rank's sequence shard (a
    row-parallel output under sequence parallelism, in place of the all-reduce). Backward: the
    shards' gradients all-gathered (every rank's partial product needs the full gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_first_dim(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _gather_first_dim(grad)


def scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    return _ScatterToSequenceParallelRegion.apply(x)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor) -> torch.Tensor:
    return _ReduceScatterToSequenceParallelRegion.apply(x)


def gather_along_sequence(x: torch.Tensor) -> torch.Tensor:
    """No autograd: the all-gather of the sequence shards (the sequence-parallel linear's input)."""
    return _gather_first_dim(x)


def reduce_scatter_along_sequence(x: torch.Tensor) -> torch.Tensor:
    """No autograd: the reduce-scatter over the sequence (that linear's input gradient)."""
    return _reduce_scatter_first_dim(x)
