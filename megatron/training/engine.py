"""One interface over DeepSpeed's two engines, so the training loop and evaluation have no
engine branch: `train_batch(data_iterator)` runs one whole iteration (every micro-batch, the
backward passes and the optimizer step) and `eval_batch(data_iterator)` one evaluation batch;
both return the loss averaged over the global batch (all micro-batches and DP replicas).
An MoE model's load-balancing loss gets its gradient scale here (`_moe_aux_loss_scale`) and its
logged value from `pop_moe_loss`."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from megatron import mpu
from megatron.model.moe.aux_loss import aux_loss_gradient_scale, take_recorded_moe_losses
from megatron.runtime.deepspeed_internals import current_loss_scale


def average_over_data_parallel(loss: torch.Tensor) -> torch.Tensor:
    """The mean of a per-replica loss over the DP group (every replica gets the same value)."""
    if mpu.get_data_parallel_world_size() > 1:
        loss = loss.clone()
        torch.distributed.all_reduce(loss, group=mpu.get_data_parallel_group())
        loss /= mpu.get_data_parallel_world_size()
    return loss


class PipelineSteps:
    """DeepSpeed's PipelineEngine already runs whole batches and averages the loss over DP.
    It caches the shapes of the activations and gradients its stages exchange (sent once): when
    the sequence length of the next batch differs from the last one's (a curriculum's training
    batches, then evaluation at --seq-length), those caches are reset, as both forks do."""

    def __init__(self, engine, seq_length: int):
        self.engine = engine
        self.seq_length = seq_length   # evaluation's
        self.shape_seqlen: int | None = None  # the length the engine's shape caches hold

    def _follow_shape(self, seqlen: int) -> None:
        if self.shape_seqlen is not None and seqlen != self.shape_seqlen:
            self.engine.reset_activation_shape()
        self.shape_seqlen = seqlen

    def train_batch(self, data_iterator: Iterator, seqlen: int | None = None) -> torch.Tensor:
        self._follow_shape(seqlen or self.seq_length)
        with _moe_aux_loss_scale(self.engine):
            return self.engine.train_batch(data_iter=data_iterator)

    def eval_batch(self, data_iterator: Iterator) -> torch.Tensor:
        self._follow_shape(self.seq_length)
        return self.engine.eval_batch(data_iter=data_iterator)


class ModuleSteps:
    """DeepSpeedEngine around a plain module (--no-pipeline-parallel): the micro-batch loop is
    ours; the engine accumulates gradients and steps at the accumulation boundary."""

    def __init__(self, engine, forward_step_func):
        self.engine = engine
        self.forward_step_func = forward_step_func

    def _micro_batches(self):
        return self.engine.gradient_accumulation_steps()

    def train_batch(self, data_iterator: Iterator, seqlen: int | None = None) -> torch.Tensor:
        # seqlen: the batches' own length (no shape cache here)
        with _moe_aux_loss_scale(self.engine):
            return self._train_batch(data_iterator)

    def _train_batch(self, data_iterator):
        total = 0.0
        for _ in range(self._micro_batches()):
            loss = self.forward_step_func(next(data_iterator), self.engine)
            self.engine.backward(loss)
            self.engine.step()
            total = total + loss.detach()
        return average_over_data_parallel(total / self._micro_batches())

    def eval_batch(self, data_iterator: Iterator) -> torch.Tensor:
        with torch.no_grad():
            total = sum(self.forward_step_func(next(data_iterator), self.engine) for _ in range(self._micro_batches()))
        return average_over_data_parallel(total / self._micro_batches())


def engine_steps(engine: Any, forward_step_func: Callable, ds_pipeline_enabled: bool,
                 seq_length: int) -> PipelineSteps | ModuleSteps:
    # engine: the DeepSpeed engine (PipelineEngine or DeepSpeedEngine); seq_length: evaluation's
    return PipelineSteps(engine, seq_length) if ds_pipeline_enabled else ModuleSteps(engine, forward_step_func)


def _moe_aux_loss_scale(engine):
    """While a training batch runs: the MoE aux losses' gradient is the one DeepSpeed gives the lm
    loss, the loss scale (fp16) over the gradient-accumulation steps (megatron/model/moe/aux_loss.py)."""
    return aux_loss_gradient_scale(current_loss_scale(engine) or 1.0, engine.gradient_accumulation_steps())


def pop_moe_loss() -> torch.Tensor | None:
    """The `moe loss` of the iteration that just ran, for the log: the mean over its training
    micro-batches of what the model's forward recorded on this rank (GPTModelPipe: the stage's own
    layers' part, summed here over the pipeline stages), averaged over DP like the lm loss; the
    record is then empty. None for a dense model. Collective on every rank of an MoE model."""
    recorded = take_recorded_moe_losses()
    if not recorded:
        return None
    loss = torch.stack(recorded).mean().to(_device())
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(loss, group=mpu.get_pipeline_model_parallel_group())
    return average_over_data_parallel(loss)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
