"""--sync-tp-duplicated-parameters (BigScience's Megatron-DeepSpeed, used for BLOOM-176B): before
each forward of a module, its parameters that every TP rank holds whole (norms, row-parallel
biases, the learned position table: the untagged ones) are averaged over the TP group, so TP ranks
that drifted apart (BLOOM's bf16 runs did) are pulled back together.

The average is taken as TP rank 0's copy plus the mean deviation from it: copies that agree have
zero deviations and stay bit for bit what they were (a plain sum-then-divide would round 3x on
the way to 4x / 4 at TP=4), and copies that disagree end at their mean."""
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def install_tp_duplicate_sync(model: nn.Module, mpu: ModuleType) -> None:
    """A forward pre-hook on every module that directly holds TP-duplicated parameters."""
    group, src_rank = mpu.get_tensor_model_parallel_group(), mpu.get_tensor_model_parallel_src_rank()
    world_size = mpu.get_tensor_model_parallel_world_size()
    if world_size == 1:
        return
    for module in model.modules():
        duplicated = [p for p in module.parameters(recurse=False) if not getattr(p, "tensor_model_parallel", False)]
        if duplicated:
            module.register_forward_pre_hook(_averager(duplicated, group, src_rank, world_size))


def _averager(params: list[nn.Parameter], group: dist.ProcessGroup, src_rank: int,
              world_size: int) -> Callable[[nn.Module, Any], None]:
    def average(module: nn.Module, inputs: Any) -> None:
        with torch.no_grad():
            local = torch._utils._flatten_dense_tensors([p.data for p in params])
            reference = local.clone()
            dist.broadcast(reference, src_rank, group=group)
            deviation = local - reference
            dist.all_reduce(deviation, group=group)
            synced = reference + deviation / world_size
            values = torch._utils._unflatten_dense_tensors(synced, [p.data for p in params])
            for p, value in zip(params, values, strict=True):
                p.data.copy_(value)
    return average
