"""One interface over DeepSpeed's two engines, so the training loop and evaluation have no
engine branch: `train_batch(data_iterator)` runs one whole iteration (every micro-batch, the
backward passes and the optimizer step) and `eval_batch(data_iterator)` one evaluation batch;
both return the loss averaged over the global batch (all micro-batches and DP replicas)."""
import torch

from megatron import mpu


def average_over_data_parallel(loss):
    """The mean of a per-replica loss over the DP group (every replica gets the same value)."""
    if mpu.get_data_parallel_world_size() > 1:
        loss = loss.clone()
        torch.distributed.all_reduce(loss, group=mpu.get_data_parallel_group())
        loss /= mpu.get_data_parallel_world_size()
    return loss


class PipelineSteps:
    """DeepSpeed's PipelineEngine already runs whole batches and averages the loss over DP."""

    def __init__(self, engine):
        self.engine = engine

    def train_batch(self, data_iterator):
        return self.engine.train_batch(data_iter=data_iterator)

    def eval_batch(self, data_iterator):
        return self.engine.eval_batch(data_iter=data_iterator)


class ModuleSteps:
    """DeepSpeedEngine around a plain module (--no-pipeline-parallel): the micro-batch loop is
    ours; the engine accumulates gradients and steps at the accumulation boundary."""

    def __init__(self, engine, forward_step_func):
        self.engine = engine
        self.forward_step_func = forward_step_func

    def _micro_batches(self):
        return self.engine.gradient_accumulation_steps()

    def train_batch(self, data_iterator):
        total = 0.0
        for _ in range(self._micro_batches()):
            loss = self.forward_step_func(next(data_iterator), self.engine)
            self.engine.backward(loss)
            self.engine.step()
            total = total + loss.detach()
        return average_over_data_parallel(total / self._micro_batches())

    def eval_batch(self, data_iterator):
        with torch.no_grad():
            total = sum(self.forward_step_func(next(data_iterator), self.engine) for _ in range(self._micro_batches()))
        return average_over_data_parallel(total / self._micro_batches())


def engine_steps(engine, forward_step_func, args):
    return PipelineSteps(engine) if args.ds_pipeline_enabled else ModuleSteps(engine, forward_step_func)

