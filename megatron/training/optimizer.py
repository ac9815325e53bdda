"""Optimizer construction and, for fp32 runs, gradient clipping with the exact global norm.

DeepSpeed's fp32 clipping sums the tied embedding's gradient on both pipeline stages and so
clips PP>1 runs harder than the same PP=1 run. For fp32 we clip in an optimizer pre-step hook
instead, over the parameters each rank owns (the same ownership rule as the parameter count);
DeepSpeed's fp16 / bf16 / ZeRO optimizers already skip pipeline-replicated parameters and clip
themselves."""
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from megatron import mpu
from megatron.config.run_config import OptimizerSettings
from megatron.runtime.deepspeed_internals import set_global_grad_norm, split_moe_param_groups
from megatron.runtime.precision import Precision
from megatron.utils import is_owned_parameter, moe_parameter_owner


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings, precision: Precision) -> torch.optim.Optimizer:
    """Biases and LayerNorm gains (the 1-D parameters) get no weight decay."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    # wd_mult (Megatron's): the share of the scheduled weight decay (--weight-decay-incr-style) a
    # group takes, which the LR scheduler sets on each step
    groups = [{"name": "decay", "params": decay, "weight_decay": settings.weight_decay, "wd_mult": 1.0},
              {"name": "no_decay", "params": no_decay, "weight_decay": 0.0, "wd_mult": 0.0}]
    if settings.create_moe_param_group:
        # the experts in groups of their own, marked `moe` (DeepSpeed's ZeRO / bf16 optimizers need it)
        groups = split_moe_param_groups(groups)
    if settings.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(groups, lr=settings.lr, momentum=settings.sgd_momentum)
    else:
        optimizer = _adam(groups, settings)
    if uses_own_clipping(settings, precision):
        moe_owner = moe_parameter_owner(model, mpu)  # MoE: each expert once, summed over every rank
        install_gradient_clipping(optimizer, settings.clip_grad, mpu.get_tensor_model_parallel_rank(),
                                  mpu.get_model_parallel_group() if moe_owner is None else None, owned=moe_owner)
    return optimizer


def _adam(groups: list[dict[str, Any]], settings: OptimizerSettings) -> torch.optim.Optimizer:
    kwargs: dict[str, Any] = dict(lr=settings.lr, betas=(settings.adam_beta1, settings.adam_beta2),
                                  eps=settings.adam_eps)
    if torch.cuda.is_available():
        try:
            from apex.optimizers import FusedAdam  # optional
            return FusedAdam(groups, adam_w_mode=True, **kwargs)
        except ImportError:
            pass
    return torch.optim.AdamW(groups, **kwargs)


def uses_own_clipping(settings: OptimizerSettings, precision: Precision) -> bool:
    """fp32 without ZeRO: the only case where DeepSpeed clips with an over-counted norm."""
    return precision.name == "fp32" and settings.zero_stage == 0


def global_grad_norm(params: Iterable[torch.Tensor], tp_rank: int, model_parallel_group: dist.ProcessGroup | None,
                     owned: Callable[[torch.Tensor], bool] | None = None) -> torch.Tensor:
    """L2 norm of the whole model's gradient: each gradient counted once over TP x PP (with
    `owned`, an MoE model's rule, over `model_parallel_group` None = every rank)."""
    if owned is None:
        def owned(p: torch.Tensor) -> bool:
            return is_owned_parameter(p, tp_rank)
    squares = [p.grad.detach().float().norm() ** 2 for p in params if p.grad is not None and owned(p)]
    total = torch.stack(squares).sum() if squares else torch.zeros(())
    if dist.is_initialized():
        total = total.to(torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu")
        dist.all_reduce(total, group=model_parallel_group)
    return total.sqrt()


def install_gradient_clipping(optimizer: torch.optim.Optimizer, max_norm: float, tp_rank: int,
                              model_parallel_group: dist.ProcessGroup | None,
                              owned: Callable[[torch.Tensor], bool] | None = None) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def clip(opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        norm = global_grad_norm(params, tp_rank, model_parallel_group, owned)
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef.to(p.grad.device))
        set_global_grad_norm(opt, norm)  # DeepSpeed's engine reports it as get_global_grad_norm()

    optimizer.register_step_pre_hook(clip)
