"""Tensor-parallel layers.

Each layer initialises the *full* (TP=1) weight with the caller's init method and keeps its own
slice, so a TP=n model holds exactly the slices of the TP=1 weights for the same seed. Split
parameters carry `tensor_model_parallel` / `partition_dim` tags; untagged parameters are
replicated on every TP rank (the parameter count and gradient-norm code rely on this).

Sequence parallelism (--sequence-parallel, Korthikanti et al. 2022): outside the linears the
activations are sequence shards [s/tp, b, h]. A column-parallel linear all-gathers its input along
the sequence (and reduce-scatters the input's gradient), a row-parallel one reduce-scatters its
output in place of the all-reduce. Its replicated bias then sees one shard only: it is tagged
`sequence_parallel`, and its gradient is summed over the TP group (sequence_parallel.py).
"""
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_along_sequence,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_along_sequence,
    reduce_scatter_to_sequence_parallel_region,
)
from .parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size


def set_tensor_model_parallel_attributes(param: torch.Tensor, partition_dim: int) -> None:
    # Megatron's tags on the tensor itself: DeepSpeed, the count and checkpoints read them
    param.tensor_model_parallel = True  # type: ignore[attr-defined]
    param.partition_dim = partition_dim  # type: ignore[attr-defined]
    param.partition_stride = 1  # type: ignore[attr-defined]


def mark_sequence_parallel(param: torch.Tensor) -> None:
    # a replicated parameter that sees one sequence shard per TP rank: its gradient is partial
    param.sequence_parallel = True  # type: ignore[attr-defined]


def _sliced_parameter(full_shape: tuple[int, ...], partition_dim: int, init_method: Callable[[torch.Tensor], Any],
                      dtype: torch.dtype, split: bool = True) -> nn.Parameter:
    """This TP rank's slice of the TP=1 tensor (split=False: the whole tensor, untagged)."""
    master = torch.empty(full_shape, dtype=torch.float32)
    init_method(master)
    if not split:
        return nn.Parameter(master.to(dtype))
    world = get_tensor_model_parallel_world_size()
    local = master.chunk(world, dim=partition_dim)[get_tensor_model_parallel_rank()]
    # a copy: a dim-0 chunk is already contiguous, and keeping it as a view would keep the whole
    # TP=1 tensor's storage alive on every TP rank (found by the measured memory report)
    param = nn.Parameter(local.to(dtype).clone(memory_format=torch.contiguous_format))
    set_tensor_model_parallel_attributes(param, partition_dim)
    return param


class _LinearWithSequenceGather(torch.autograd.Function):
    """y = all_gather_s(x) A^T + b for a sequence shard x [s/tp, b, i]. Saves the shard, not the
    gathered input, and gathers it again in backward for A's gradient: the saved activation is
    1/tp of the input (what sequence parallelism is for; Megatron-LM does the same). The input's
    gradient [s, b, i] is reduce-scattered back to the shard (each rank's partial sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(gather_along_sequence(x), weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_input = reduce_scatter_along_sequence(grad.matmul(weight))
        total = gather_along_sequence(x)
        grad_2d = grad.reshape(-1, grad.size(-1))
        grad_weight = grad_2d.t().matmul(total.reshape(-1, total.size(-1)))
        grad_bias = grad_2d.sum(dim=0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias


def linear_with_sequence_gather(x: torch.Tensor, weight: torch.Tensor,
                                bias: torch.Tensor | None = None) -> torch.Tensor:
    """[s/tp, b, i] shard -> [s, b, o/tp]: the sequence-parallel column-parallel product."""
    return _LinearWithSequenceGather.apply(x, weight, bias)


def divide(numerator: int, denominator: int) -> int:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


class VocabParallelEmbedding(nn.Module):
    """Embedding split along the (padded) vocabulary: each TP rank owns a contiguous id range."""

    def __init__(self, num_embeddings: int, embedding_dim: int, init_method: Callable[[torch.Tensor], Any],
                 params_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        world = get_tensor_model_parallel_world_size()
        per_rank = divide(num_embeddings, world)
        self.vocab_start_index = get_tensor_model_parallel_rank() * per_rank
        self.vocab_end_index = self.vocab_start_index + per_rank
        self.num_embeddings = num_embeddings
        self.weight = _sliced_parameter((num_embeddings, embedding_dim), 0, init_method, params_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if get_tensor_model_parallel_world_size() == 1:
            return F.embedding(input_ids, self.weight)
        # ids outside our slice look up row 0 and are zeroed; the all-reduce fills them in
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)
        out = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_model_parallel_region(out)


class ColumnParallelLinear(nn.Module):
    """Y = XA + b with A split along its output dimension: A = [A_1 ... A_p].
    tensor_parallel=False: A whole on this rank, no collective (an MoE expert that is not split)."""

    def __init__(self, input_size: int, output_size: int, init_method: Callable[[torch.Tensor], Any],
                 bias: bool = True, gather_output: bool = False, params_dtype: torch.dtype = torch.float32,
                 tensor_parallel: bool = True, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.gather_output = gather_output
        self.tensor_parallel = tensor_parallel
        self.sequence_parallel = sequence_parallel and tensor_parallel  # the input is a sequence shard
        self.weight = _sliced_parameter((output_size, input_size), 0, init_method, params_dtype, tensor_parallel)
        if bias:
            self.bias = _sliced_parameter((output_size,), 0, nn.init.zeros_, params_dtype, tensor_parallel)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tensor_parallel:
            return F.linear(x, self.weight, self.bias)
        if self.sequence_parallel:
            y = linear_with_sequence_gather(x, self.weight, self.bias)
        else:
            y = F.linear(copy_to_tensor_model_parallel_region(x), self.weight, self.bias)
        return gather_from_tensor_model_parallel_region(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = XA + b with A split along its input dimension; partial products are all-reduced
    (sequence_parallel: reduce-scattered along the sequence). The bias is replicated and added
    once, after the reduction. tensor_parallel=False: A whole on this rank, no reduction."""

    def __init__(self, input_size: int, output_size: int, init_method: Callable[[torch.Tensor], Any],
                 bias: bool = True, params_dtype: torch.dtype = torch.float32, tensor_parallel: bool = True,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.tensor_parallel = tensor_parallel
        self.sequence_parallel = sequence_parallel and tensor_parallel
        self.weight = _sliced_parameter((output_size, input_size), 1, init_method, params_dtype, tensor_parallel)
        if bias:
            self.bias = nn.Parameter(torch.zeros(output_size, dtype=params_dtype))
            if self.sequence_parallel:
                mark_sequence_parallel(self.bias)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y)  # [s/tp, b, h]
        elif self.tensor_parallel:
            y = reduce_from_tensor_model_parallel_region(y)
        return y + self.bias if self.bias is not None else y
