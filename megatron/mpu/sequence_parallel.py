"""The gradients of replicated parameters under sequence parallelism (--sequence-parallel).

A norm weight or a row-parallel bias is whole on every TP rank, but under sequence parallelism
each rank applies it to its own sequence shard only, so each rank's gradient is the part from its
shard; the true gradient is their sum over the TP group. Megatron-LM all-reduces these
(`sequence_parallel`-tagged) gradients once per step, before the optimizer.

Here the sum is taken as each micro-batch's gradient arrives, in a hook on the parameter that runs
before autograd accumulates it: DeepSpeed's engines then see the summed gradient whatever they do
next (ZeRO 2 moves gradients into its buckets during backward, ZeRO 1 / bf16 accumulate into their
own buffers, the pipeline engine reduces inside train_batch), so one place serves every engine,
ZeRO stage and gradient-accumulation count. Sums are linear: summing per micro-batch gives the same
gradient as summing once per step; the cost is one small all-reduce per tagged tensor and
micro-batch (norms and biases: O(h) elements each).
"""
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from .parallel_state import get_tensor_model_parallel_group, get_tensor_model_parallel_world_size
from .shm_comm import tensor_model_parallel_all_reduce


def sequence_parallel_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]


def install_sequence_parallel_grad_allreduce(model: nn.Module) -> int:
    """Hooks every `sequence_parallel` parameter's gradient; returns how many (0 at TP=1)."""
    if get_tensor_model_parallel_world_size() == 1:
        return 0
    params = sequence_parallel_parameters(model)
    for p in params:
        p.register_hook(_summed_over_tp(get_tensor_model_parallel_group()))
    return len(params)


def _summed_over_tp(group: dist.ProcessGroup) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        # a copy: autograd may hand the same buffer elsewhere, so never reduce it in place
        return tensor_model_parallel_all_reduce(grad.clone(), dist.ReduceOp.SUM, group)
    return hook
