"""The checks that stop a run on a bad loss, right after an iteration's step and before anything
of it is logged or saved: Megatron-LM's --check-for-nan-in-loss-and-grad (on by default) and
--check-for-spiky-loss (off by default). Every rank decides the same from one MAX all-reduce of two
numbers; the stop itself (no save, the trackers moved off the checkpoints whose weights produced the
loss, one line, exit code 3) is the Trainer's (megatron/training/trainer.py)."""
import math
from typing import Any

import torch

from megatron.schedules.progress import TrainingProgress

# Megatron-LM's pretrain_gpt.py: "define spiky loss as a loss that's 10x the max loss observed";
# its RerunStateMachine.is_unexpectedly_large takes the max over the first 100 values it sees
SPIKY_LOSS_FACTOR = 10
SPIKY_LOSS_SAMPLES = 100

NON_FINITE, SPIKY = "non-finite", "spiky"


class LossCheckStop(Exception):
    """The run stopped on a loss check: nothing was saved at that iteration. Raised by Trainer.run
    on every rank after the one line; pretrain_gpt.py exits with code 3."""


class NonFiniteLoss(LossCheckStop):
    """--check-for-nan-in-loss-and-grad: the loss or the gradient norm was not finite."""


class SpikyLoss(LossCheckStop):
    """--check-for-spiky-loss: the loss was at least SPIKY_LOSS_FACTOR times the reference."""


def is_spiky(progress: TrainingProgress, loss: float, samples: int = SPIKY_LOSS_SAMPLES,
             factor: float = SPIKY_LOSS_FACTOR) -> bool:
    """Megatron-LM's rule: the first `samples` finite losses of the run only build the reference (the
    largest |loss| among them); every later one is spiky when |loss| >= factor x that reference. A
    NaN / Inf is neither (the NaN check's business). The reference lives in `progress`, so it is
    saved with every checkpoint and a resumed run goes on with the same one."""
    value = abs(loss)
    if not math.isfinite(value):
        return False
    if progress.spiky_loss_samples < samples:
        progress.spiky_loss_samples += 1
        progress.spiky_loss_max = max(progress.spiky_loss_max, value)
        return False
    return value >= factor * progress.spiky_loss_max


def agree_on_loss(loss: torch.Tensor, engine: Any, nan_check: bool, spiky_check: bool,
                  progress: TrainingProgress, samples: int = SPIKY_LOSS_SAMPLES) -> tuple[str | None, float]:
    """(NON_FINITE, SPIKY or None; the largest finite |loss| of every rank, -1 without one), the
    same on every rank. Each rank judges the loss it has (the
    pipeline engine broadcasts the last stage's DP mean; without it each DP rank has its own): one
    MAX all-reduce of [the loss or gradient norm is not finite, |loss| where finite], so one rank
    alone seeing either stops every rank, and the spike rule runs on the largest finite loss of all
    ranks (the same value, hence the same reference, everywhere). A step the engine skipped (fp16 /
    bf16 overflow: the loss scaler's business) is neither checked nor sampled. No collective when
    both checks are off."""
    if not (nan_check or spiky_check):
        return None, -1.0
    applied = engine.was_step_applied()
    flags = torch.tensor([0.0, -1.0], device=loss.device)  # -1: no finite loss on this rank
    if applied:
        value = loss.detach().float()
        bad = ~torch.isfinite(value)
        grad_norm = engine.get_global_grad_norm()  # cached by the step (None: not computed)
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(torch.as_tensor(grad_norm, device=loss.device))
        flags[0] = bad.to(torch.float32)
        flags[1] = torch.where(torch.isfinite(value), value.abs(), -torch.ones_like(value))
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    non_finite, largest = flags.tolist()
    if nan_check and non_finite:
        return NON_FINITE, largest
    if spiky_check and applied and largest >= 0 and is_spiky(progress, largest, samples):
        return SPIKY, largest
    return None, largest
