"""A LoggingConfig, cached counts and progress with round numbers, and a SummaryWriter stand-in that
keeps what it is given: what the log-line tests (test_claims_logging, test_log_line_optional_fields)
work their expected values out from by hand."""
from types import SimpleNamespace

from megatron.metrics.config import LoggingConfig
from megatron.metrics.memory import TrainingSetup
from megatron.metrics.mfu import MfuSettings
from megatron.model.shape import ModelShape


class Recorder:
    """A SummaryWriter that keeps what it is given."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, {})[step] = float(value)

    def add_text(self, *args):
        pass


# 4 ranks, DP 2, seq 32, 1e12 FLOPs per sample with recompute, 5e11 without, a 1 TFLOP/s peak
CONFIG = LoggingConfig(log_interval=1, tensorboard_dir=None, tensorboard_queue_size=1, writes_tensorboard=False,
                       log_batch_size_to_tensorboard=True, log_timers_to_tensorboard=True,
                       log_validation_ppl_to_tensorboard=True, log_params_norm=False, log_num_zeros_in_grad=False,
                       log_optimizer_states_to_tensorboard=False, world_size=4, data_parallel_size=2, seq_length=32,
                       model_shape=ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32),
                       memory=TrainingSetup(), mfu=MfuSettings(peak_tflops_per_device=1.0, reason="a 1 TFLOP/s peak"))
CACHE = SimpleNamespace(flops_per_sample=1e12, model_flops_per_sample=5e11)  # what megatron/utils.py caches on args
PROGRESS = SimpleNamespace(iteration=12, consumed_train_samples=96, consumed_train_tokens=96 * 32,
                           gigaflos_no_embeds=7.5)
