"""Cross entropy over logits split along the vocabulary across TP ranks, without gathering them:
the max, then the sum of exponentials and the target logit together (one all-reduce of both), are
all-reduced as scalars per token."""
from typing import Any

import torch
import torch.distributed as dist

from .parallel_state import (
    get_tensor_model_parallel_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from .shm_comm import tensor_model_parallel_all_reduce


def _all_reduce(x: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
    if get_tensor_model_parallel_world_size() > 1:
        tensor_model_parallel_all_reduce(x, op, get_tensor_model_parallel_group())


class _VocabParallelCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # logits: [..., V/tp] (fp32), target: [...] global vocabulary ids
        logits_max = logits.amax(dim=-1)  # the same values as max(dim=-1)[0], without the indices (8x faster on CPU)
        _all_reduce(logits_max, dist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)

        per_rank = logits.size(-1)
        start = get_tensor_model_parallel_rank() * per_rank
        outside = (target < start) | (target >= start + per_rank)
        local_target = (target - start).masked_fill(outside, 0)
        predicted = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp_logits = logits.exp_()  # logits is our own shifted copy: no second [.., V] buffer
        # both sums in one all-reduce: [2, ...] (an elementwise sum, so the same values as two)
        sums = torch.stack((predicted, exp_logits.sum(dim=-1)))
        _all_reduce(sums, dist.ReduceOp.SUM)
        predicted, sum_exp = sums[0], sums[1]
        loss = sum_exp.log() - predicted

        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax  # d loss / d logits = softmax - onehot(target)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), (outside.to(grad.dtype) - 1.0).unsqueeze(-1))
        return grad.mul_(grad_output.unsqueeze(-1)), None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token loss; logits are upcast to fp32 for a stable softmax."""
    return _VocabParallelCrossEntropy.apply(logits.float(), target)
