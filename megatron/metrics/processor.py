"""MetricsProcessor: the run's metrics as one object (torchtitan's MetricsProcessor), built from the
run configuration's logging section. It owns the TensorBoard writer (the last rank's, with
--tensorboard-dir), decides when a log line is due (`should_log`), and holds what the metrics
carry between calls: the memory probe of the first iteration and the --log-num-zeros-in-grad
counter. The Trainer owns one and calls it; it reads no flag from `args`, only the parameter
counts and FLOPs per sample megatron/utils.py caches there when the model is built."""
from argparse import Namespace
from typing import Any

import torch

from megatron import mpu
from megatron.metrics.config import LoggingConfig
from megatron.metrics.grad_stats import ZeroCounter, params_norm
from megatron.metrics.memory_measure import MemoryProbe, finish_memory_probe, startup_report
from megatron.metrics.optimizer_states import log_optimizer_states, optimizer_state_norms
from megatron.metrics.training_log import IntervalStats, NoWriter, evaluation_log, log_model_size, training_log
from megatron.metrics.wandb_writer import WandbWriter, Writers
from megatron.runtime.deepspeed_internals import current_loss_scale
from megatron.schedules.progress import TrainingProgress


def open_tensorboard_writer(config: LoggingConfig) -> Any:
    """A SummaryWriter on the rank that writes TensorBoard (the last: it sees the loss under
    pipeline parallelism), a NoWriter elsewhere and without --tensorboard-dir; with --wandb-project,
    the same scalars to W&B from that rank too (megatron/metrics/wandb_writer.py)."""
    writers: list[Any] = []
    if config.writes_tensorboard:
        from torch.utils.tensorboard import SummaryWriter  # only runs that write TensorBoard pay for it
        writers.append(SummaryWriter(log_dir=config.tensorboard_dir, max_queue=config.tensorboard_queue_size))
    if config.writes_wandb:
        writers.append(WandbWriter(config))
    if not writers:
        return NoWriter()
    return writers[0] if len(writers) == 1 else Writers(writers)


class MetricsProcessor:
    """`cache`: the global `args` once megatron/utils.py cached the parameter counts and FLOPs per
    sample on it (read at each log, never written here). `writer`: anything with add_scalar /
    add_text / close (tests pass a recorder); None opens the run's own (open_tensorboard_writer)."""

    def __init__(self, config: LoggingConfig, cache: Namespace, writer: Any = None) -> None:
        self.config = config
        self.cache = cache
        self.writer = open_tensorboard_writer(config) if writer is None else writer
        self.memory_probe: MemoryProbe | None = None  # armed at startup, read after the first iteration
        self.memory_measured: list | None = None      # what the first iteration measured, on every rank
        self.zero_counter: ZeroCounter | None = None  # --log-num-zeros-in-grad

    def should_log(self, iteration: int) -> bool:
        return iteration % self.config.log_interval == 0

    # --- startup -------------------------------------------------------------------------------

    def log_model_size(self, report_lines: list[str]) -> None:
        """The parameter counts as scalars and the startup report as text, at step 0."""
        log_model_size(self.writer, self.cache, self.config.model_shape.is_moe, report_lines)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
        """--log-num-zeros-in-grad: a pre-step hook counts the gradient's zeros (register it after
        the clipping hook, so it sees the gradient the step applies)."""
        if self.config.log_num_zeros_in_grad:
            self.zero_counter = ZeroCounter(optimizer, model, mpu)

    def startup_report(self, engine: Any) -> None:  # engine: the DeepSpeed engine
        """The predicted memory table and the MFU peak (rank 0); arms the first iteration's
        measurement."""
        self.memory_probe = startup_report(engine, self.config)

    def measure_memory(self) -> list | None:
        """Once, after the first iteration: every rank measures what it holds, the last rank prints
        it next to the prediction (megatron/metrics/memory_measure.py). Later calls return the same."""
        if self.memory_probe is not None:
            probe, self.memory_probe = self.memory_probe, None
            self.memory_measured = finish_memory_probe(probe, self.config.model_shape)
        return self.memory_measured

    # --- per log interval ----------------------------------------------------------------------

    def step_values(self, engine: Any) -> dict[str, Any]:
        """What the log line reads off the engine and model: grad norm, loss scale, and with their
        flags the params norm (a collective over the model-parallel group) and zeros in grad."""
        config = self.config
        return dict(grad_norm=engine.get_global_grad_norm(), loss_scale=current_loss_scale(engine),
                    params_norm=params_norm(engine.module, mpu) if config.log_params_norm else None,
                    num_zeros=self.zero_counter.last if self.zero_counter else None)

    def log_training(self, stats: IntervalStats, elapsed: float, progress: TrainingProgress, **values: Any) -> None:
        """The iteration's log line and scalars (megatron/metrics/training_log.py: training_log)."""
        if self.config.log_memory_to_tensorboard:  # validation made sure a CUDA device is there
            values["memory_stats"] = torch.cuda.memory_stats()
        training_log(self.writer, self.config, self.cache, stats, elapsed, progress, **values)

    def log_optimizer_states(self, engine: Any, progress: TrainingProgress) -> None:
        """--log-optimizer-states-to-tensorboard (collectives on every rank, written by the last)."""
        if self.config.log_optimizer_states_to_tensorboard:
            log_optimizer_states(self.writer, optimizer_state_norms(engine, mpu), progress)

    def log_evaluation(self, prefix: str, loss: float, progress: TrainingProgress, name: str | None = None,
                       tensorboard: bool = True) -> None:
        evaluation_log(self.writer, self.config, prefix, loss, progress, tensorboard=tensorboard, name=name)

    def close(self) -> None:
        """Flush and close the writer (at the end of the run); a second call does nothing."""
        self.writer.close()
        self.writer = NoWriter()
