"""--log-params-norm and --log-num-zeros-in-grad (Megatron's 'params norm' and 'num zeros' in the
log line and TensorBoard). Each parameter counts once over the whole model: the ownership rule of
the parameter count (a TP-duplicated or pipeline-replicated copy does not count; an MoE model's
experts once over every rank), summed over the model-parallel group (every rank for MoE).

Megatron-DeepSpeed computes the norm the same way; its zeros count is only computed by Megatron's
own optimizer, which a DeepSpeed run does not use (the fork logs 0 or nothing there). Here the
zeros are counted in the optimizer's pre-step hook, on the gradient the step applies."""
from types import ModuleType

import torch
import torch.distributed as dist

from megatron.utils import is_owned_parameter, moe_parameter_owner


def _ownership(model, mpu):
    """(owned(param), the group to sum over): the rule of megatron/training/optimizer.py's clipping."""
    moe_owner = moe_parameter_owner(model, mpu)
    if moe_owner is not None:
        return moe_owner, None
    tp_rank = mpu.get_tensor_model_parallel_rank()
    return (lambda p: is_owned_parameter(p, tp_rank)), mpu.get_model_parallel_group()


def _sum(value, group):
    total = torch.tensor([float(value)], dtype=torch.float64)
    if dist.is_initialized():
        if torch.cuda.is_available():
            total = total.cuda()
        dist.all_reduce(total, group=group)
    return float(total.item())


def params_norm(model: torch.nn.Module, mpu: ModuleType) -> float:
    """L2 norm of every parameter of the model, each counted once (float64 sums of squares)."""
    owned, group = _ownership(model, mpu)
    squares = sum(float(p.detach().double().pow(2).sum()) for p in model.parameters() if owned(p))
    return _sum(squares, group) ** 0.5


class ZeroCounter:
    """Counts the zero entries of the gradient at each optimizer step; `last` is the latest count."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, mpu) -> None:
        self.owned, self.group = _ownership(model, mpu)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.last: int | None = None
        optimizer.register_step_pre_hook(self._count)

    def _count(self, optimizer, args, kwargs):
        zeros = sum(int((p.grad == 0).sum()) for p in self.params if p.grad is not None and self.owned(p))
        self.last = int(round(_sum(zeros, self.group)))
