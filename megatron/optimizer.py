"""Optimizer construction and, for fp32 runs, gradient clipping with the exact global norm.

DeepSpeed's fp32 clipping sums the tied embedding's gradient on both pipeline stages and so
clips PP>1 runs harder than the same PP=1 run. For fp32 we clip in an optimizer pre-step hook
instead, over the parameters each rank owns (the same ownership rule as the parameter count);
DeepSpeed's fp16 / bf16 / ZeRO optimizers already skip pipeline-replicated parameters and clip
themselves."""
import torch
import torch.distributed as dist

from megatron import mpu
from megatron.utils import is_owned_parameter


def build_optimizer(model, args):
    """Biases and LayerNorm gains (the 1-D parameters) get no weight decay."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=args.sgd_momentum)
    else:
        optimizer = _adam(groups, args)
    if uses_own_clipping(args):
        install_gradient_clipping(optimizer, args.clip_grad, mpu.get_tensor_model_parallel_rank(),
                                  mpu.get_model_parallel_group())
    return optimizer


def _adam(groups, args):
    kwargs = dict(lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps)
    if torch.cuda.is_available():
        try:
            from apex.optimizers import FusedAdam  # optional
            return FusedAdam(groups, adam_w_mode=True, **kwargs)
        except ImportError:
            pass
    return torch.optim.AdamW(groups, **kwargs)


def uses_own_clipping(args):
    """fp32 without ZeRO: the only case where DeepSpeed clips with an over-counted norm."""
    return not (args.fp16 or args.bf16) and args.zero_stage == 0


def global_grad_norm(params, tp_rank, model_parallel_group):
    """L2 norm of the whole model's gradient: each gradient counted once over TP x PP."""
    squares = [p.grad.detach().float().norm() ** 2 for p in params
               if p.grad is not None and is_owned_parameter(p, tp_rank)]
    total = torch.stack(squares).sum() if squares else torch.zeros(())
    if dist.is_initialized():
        total = total.to(torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu")
        dist.all_reduce(total, group=model_parallel_group)
    return total.sqrt()


def install_gradient_clipping(optimizer, max_norm, tp_rank, model_parallel_group):
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def clip(opt, args, kwargs):
        norm = global_grad_norm(params, tp_rank, model_parallel_group)
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef.to(p.grad.device))
        opt._global_grad_norm = norm  # DeepSpeed's engine reports this as get_global_grad_norm()

    optimizer.register_step_pre_hook(clip)
