"""Tensor-parallel layers.

Each layer initialises the *full* (TP=1) weight with the caller's init method and keeps its own
slice, so a TP=n model holds exactly the slices of the TP=1 weights for the same seed. Split
parameters carry `tensor_model_parallel` / `partition_dim` tags; untagged parameters are
replicated on every TP rank (the parameter count and gradient-norm code rely on this).
"""
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from .parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size


def set_tensor_model_parallel_attributes(param: torch.Tensor, partition_dim: int) -> None:
    # Megatron's tags on the tensor itself: DeepSpeed, the count and checkpoints read them
    param.tensor_model_parallel = True  # type: ignore[attr-defined]
    param.partition_dim = partition_dim  # type: ignore[attr-defined]
    param.partition_stride = 1  # type: ignore[attr-defined]


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
                 tensor_parallel: bool = True) -> None:
        super().__init__()
        self.gather_output = gather_output
        self.tensor_parallel = tensor_parallel
        self.weight = _sliced_parameter((output_size, input_size), 0, init_method, params_dtype, tensor_parallel)
        if bias:
            self.bias = _sliced_parameter((output_size,), 0, nn.init.zeros_, params_dtype, tensor_parallel)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tensor_parallel:
            return F.linear(x, self.weight, self.bias)
        x = copy_to_tensor_model_parallel_region(x)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tensor_model_parallel_region(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """Y = XA + b with A split along its input dimension; partial products are all-reduced.
    The bias is replicated and added once, after the reduction. tensor_parallel=False: A whole
    on this rank, no reduction."""

    def __init__(self, input_size: int, output_size: int, init_method: Callable[[torch.Tensor], Any],
                 bias: bool = True, params_dtype: torch.dtype = torch.float32, tensor_parallel: bool = True) -> None:
        super().__init__()
        self.tensor_parallel = tensor_parallel
        self.weight = _sliced_parameter((output_size, input_size), 1, init_method, params_dtype, tensor_parallel)
        if bias:
            self.bias = nn.Parameter(torch.zeros(output_size, dtype=params_dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tensor_parallel:
            y = reduce_from_tensor_model_parallel_region(y)
        return y + self.bias if self.bias is not None else y
