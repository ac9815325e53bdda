"""DeepSpeed-Ulysses sequence parallelism (--ds-sequence-parallel-size): each SP rank of a replica
holds a contiguous chunk of every sequence; attention runs DeepSpeed's own DistributedAttention,
whose all-to-all turns [s/SP, b, heads, d] into [s, b, heads/SP, d] and back, so the attention
core sees the whole sequence for its share of the heads. Everything outside attention is per token
and runs on the local chunk unchanged.

Every function here is the identity at SP = 1."""
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .parallel_state import get_sequence_parallel_group, get_sequence_parallel_rank, get_sequence_parallel_world_size


def sequence_chunk(t: torch.Tensor, dim: int) -> torch.Tensor:
    """This SP rank's contiguous chunk of `t` along `dim` (the sequence): rank r holds positions
    [r s/SP, (r+1) s/SP), as in Microsoft's fork (its get_batch)."""
    sp = get_sequence_parallel_world_size()
    if sp == 1:
        return t
    return t.chunk(sp, dim=dim)[get_sequence_parallel_rank()].contiguous()


class _GatherSequence(torch.autograd.Function):
    """Forward: the SP ranks' chunks concatenated along dim 0. Backward: this rank's chunk of the
    gradient. Each SP rank then computes the same function of the whole sequence (the loss), and
    its backward reaches only its own tokens: DeepSpeed sums the SP ranks' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(get_sequence_parallel_world_size())]
        dist.all_gather(parts, x.contiguous(), group=get_sequence_parallel_group())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return sequence_chunk(grad, 0)


def gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """[s/SP, ...] -> [s, ...] over the SP group (differentiable)."""
    if get_sequence_parallel_world_size() == 1:
        return x
    return _GatherSequence.apply(x)


def sequence_parallel_attention(core: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor] | None:
    """`core(q, k, v)` on [s, b, heads, d] tensors of the whole sequence, as DeepSpeed's
    DistributedAttention calls it: q [s/SP, b, a, d], k, v [s/SP, b, g, d] in; [s/SP, b, a, d] out.
    Query and key/value heads are split into SP contiguous blocks (validation: SP divides both),
    so a rank's query heads keep their own key/value heads (GQA groups are contiguous). None at
    SP = 1 (the core is called directly)."""
    if get_sequence_parallel_world_size() == 1:
        return None
    from megatron.runtime.deepspeed_internals import distributed_attention
    # scatter the heads (dim 2), gather the sequence (dim 0); batch_dim_idx 1: [s, b, ...]
    attention = distributed_attention(core, get_sequence_parallel_group(), scatter_idx=2, gather_idx=0)
    return lambda q, k, v: attention(q, k, v, 1)
