"""The MoE layers' auxiliary load-balancing loss, `moe loss` = moe_loss_coeff x the sum of the MoE
layers' l_aux: how it reaches the gradient, and the per-step record the training log reads.

Gradient. An MoE layer passes its output through MoEAuxLossAutoScaler together with its
coeff x l_aux. Forward returns the output unchanged; backward returns the output's gradient and
gives the aux loss the gradient DeepSpeed gives the lm loss (loss scale / gradient-accumulation
steps, set around each training batch by megatron/training/engine.py): backward sees lm loss + moe loss
while the engines return, and the log prints, the lm loss alone. So a layer returns one hidden-states
tensor, only hidden states cross a pipeline stage boundary, and activation checkpointing needs
nothing special (the recomputation attaches the loss again and its backward emits the gradient).

Log. The model's forward (GPTModel, or one GPTModelPipe stage) collects the aux losses its own
layers attach (collect_aux_losses) and, for a training micro-batch, records their sum
(record_moe_loss; 0 on a stage without MoE layers). megatron/training/engine.py's pop_moe_loss turns the
records of an iteration into the logged value. A recomputation runs in backward, outside every
forward's collection, so it records nothing.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch


class MoEAuxLossAutoScaler(torch.autograd.Function):
    """Identity on `output` that gives `aux_loss` the gradient loss_scale / micro_batches in backward
    (Megatron-core's name for the same device). The class attributes hold the current scale."""

    loss_scale: float = 1.0   # fp16's loss scale; 1 otherwise
    micro_batches: int = 1    # DeepSpeed divides the loss by the gradient-accumulation steps

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (aux_loss,) = ctx.saved_tensors
        # the same arithmetic as DeepSpeed's on the lm loss (times the loss scale, divided by the
        # accumulation steps), so the aux loss's gradient equals the lm loss's bit for bit
        scale = MoEAuxLossAutoScaler
        return grad_output, torch.full_like(aux_loss, scale.loss_scale) / scale.micro_batches


@contextlib.contextmanager
def aux_loss_gradient_scale(loss_scale: float, micro_batches: int) -> Iterator[None]:
    """The aux losses' gradient scale while a training batch runs (restored afterwards)."""
    scale = MoEAuxLossAutoScaler
    previous = scale.loss_scale, scale.micro_batches
    scale.loss_scale, scale.micro_batches = loss_scale, micro_batches
    try:
        yield
    finally:
        scale.loss_scale, scale.micro_batches = previous


_COLLECTING: list[list[torch.Tensor]] = []   # one list per model forward in progress
_TRAIN_MOE_LOSSES: list[torch.Tensor] = []   # one per training micro-batch since the last take (detached)


def attach_aux_loss(output: torch.Tensor, aux_loss: torch.Tensor) -> torch.Tensor:
    """`output` (the same values) carrying `aux_loss`'s gradient; the forward in progress collects it."""
    if _COLLECTING:
        _COLLECTING[-1].append(aux_loss.detach())
    return MoEAuxLossAutoScaler.apply(output, aux_loss)


@contextlib.contextmanager
def collect_aux_losses() -> Iterator[list[torch.Tensor]]:
    """The aux losses (detached) that the MoE layers attach inside the block, in layer order."""
    collected: list[torch.Tensor] = []
    _COLLECTING.append(collected)
    try:
        yield collected
    finally:
        _COLLECTING.pop()


def record_moe_loss(aux_losses: list[torch.Tensor], like: torch.Tensor) -> None:
    """For the log: one training micro-batch's moe loss on this rank, the sum of `aux_losses` (the
    model's or the stage's layers, in layer order; 0 without any, on the device and dtype of `like`)."""
    total = functools.reduce(torch.add, aux_losses) if aux_losses else like.new_zeros(())
    _TRAIN_MOE_LOSSES.append(total.float())


def take_recorded_moe_losses() -> list[torch.Tensor]:
    """The records since the last take, oldest first; the record is then empty."""
    taken = list(_TRAIN_MOE_LOSSES)
    _TRAIN_MOE_LOSSES.clear()
    return taken
