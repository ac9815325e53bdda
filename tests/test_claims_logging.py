"""The log line, the TensorBoard scalars and the evaluation mean, with every number worked out by
hand from chosen inputs (in-process: no launch). The launch tests read these values back from real
runs, but mostly compare them with other numbers the same run printed; here each one is written
out: the interval's mean loss without the skipped iteration, samples / tokens per second, per
replica, TFLOPs per GPU, MFU, the validation perplexity exp(min(20, loss)) and the mean over
--eval-iters batches."""
import math
from types import SimpleNamespace

import pytest
import torch

from megatron import global_vars
from megatron.training_log import IntervalStats, evaluation_log, training_log


class Recorder:
    """A SummaryWriter that keeps what it is given."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, {})[step] = float(value)

    def add_text(self, *args):
        pass


@pytest.fixture
def writer(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(global_vars, "_GLOBAL_TENSORBOARD_WRITER", recorder)
    return recorder


# 4 ranks, DP 2, seq 32, 1e12 FLOPs per sample with recompute, 5e11 without, a 1 TFLOP/s peak
ARGS = SimpleNamespace(flops_per_sample=1e12, model_flops_per_sample=5e11, peak_tflops_per_device=1.0,
                       world_size=4, data_parallel_size=2, seq_length=32,
                       log_batch_size_to_tensorboard=True, log_timers_to_tensorboard=True,
                       log_validation_ppl_to_tensorboard=True)
PROGRESS = SimpleNamespace(iteration=12, consumed_train_samples=96, consumed_train_tokens=96 * 32,
                           gigaflos_no_embeds=7.5)


def test_training_line_and_scalars_by_hand(writer, capsys):
    stats = IntervalStats()
    stats.add(torch.tensor(2.0), samples=8, applied=True)
    stats.add(torch.tensor(100.0), samples=8, applied=False)  # an overflow step: its loss is not the model's
    stats.add(torch.tensor(4.0), samples=8, applied=True)
    training_log(stats, elapsed=2.0, lr=3e-4, grad_norm=torch.tensor(1.25), loss_scale=None, global_batch_size=8,
                 progress=PROGRESS, args=ARGS, total_iterations=100)
    line = capsys.readouterr().out
    # 24 samples in 2 s: 12 samples/s, 384 tokens/s, per replica (DP 2) 6 and 192;
    # TFLOPs per GPU 1e12 x 24 / (2 s x 4 ranks) / 1e12 = 3; MFU 5e11 x 24 / 2 / 4 / 1e12 = 150 %
    for part in (" iteration       12/     100 |", " consumed samples:           96 |",
                 " consumed tokens:         3072 |", " elapsed time per iteration (ms): 666.7 |",
                 " learning rate: 3.000E-04 |", " global batch size:     8 |",
                 " lm loss: 3.000000E+00 |",  # (2 + 4) / 2: the skipped step's 100 left out
                 " grad norm: 1.250 |", " number of skipped iterations:   1 |",
                 " samples per second: 12.000 | TFLOPs: 3.00 |", " MFU: 150.00% |"):
        assert part in line, part
    s = writer.scalars
    assert s["lm-loss-training/lm loss"] == {12: 3.0}
    assert s["lm-loss-training/lm loss vs samples"] == {96: 3.0}
    assert s["lm-loss-training/lm loss vs tokens"] == {3072: 3.0}
    assert s["lm-loss-training/lm loss vs gigaflos (without embeddings)"] == {7.5: 3.0}
    assert s["iteration-time/samples per second"] == {12: 12.0}
    assert s["iteration-time/samples per second per replica"] == {12: 6.0}
    assert s["iteration-time/tokens per second"] == {12: 384.0}
    assert s["iteration-time/tokens per second per replica"] == {12: 192.0}
    assert s["iteration-time/TFLOPs per gpu (estimated)"] == {12: 3.0}
    assert s["iteration-time/MFU"] == {12: 1.5}
    assert s["iteration-time/iteration-time"] == {12: pytest.approx(2.0 / 3)}
    assert s["grad-norm/grad-norm"] == {12: 1.25}
    assert s["batch-size/batch-size"] == {12: 8.0}
    assert s["learning-rate/learning-rate vs tokens"] == {3072: pytest.approx(3e-4)}


@pytest.mark.parametrize("loss,ppl", [(2.5, 12.182493960703473), (25.0, math.e ** 20)])
def test_validation_line_and_perplexity_by_hand(writer, capsys, loss, ppl):
    """exp(2.5) = 12.18249396...; a loss above 20 is capped at exp(20) (Megatron's overflow guard)."""
    evaluation_log("iteration 12", loss, PROGRESS, ARGS)
    out = capsys.readouterr().out
    assert f" validation loss at iteration 12 | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} |" in out
    s = writer.scalars
    assert s["lm-loss-validation/lm loss validation"] == {12: loss}
    assert s["lm-loss-validation/lm loss validation ppl"] == {12: pytest.approx(ppl, rel=1e-6)}
    assert s["lm-loss-validation/lm loss validation ppl vs samples"] == {96: pytest.approx(ppl, rel=1e-6)}


def test_evaluation_is_the_mean_over_eval_iters():
    """Three batches with losses 1, 2 and 6: mean 3; 3 batches of the current global batch 8 read."""
    from megatron.run_config import EvaluationSettings
    from megatron.trainer import Trainer

    class Engine:
        def __init__(self):
            self.modes = []

        def eval(self):
            self.modes.append("eval")

        def train(self):
            self.modes.append("train")

    losses = iter([1.0, 2.0, 6.0])
    steps = SimpleNamespace(engine=Engine(), eval_batch=lambda data: torch.tensor(next(losses)))
    calculator = SimpleNamespace(get_current_global_batch_size=lambda: 8)
    trainer = Trainer.__new__(Trainer)  # the parts evaluate() reads, without building a model
    trainer.evaluation = EvaluationSettings(eval_interval=None, eval_iters=3)
    trainer.engine, trainer.steps = steps.engine, steps
    trainer.calculator = calculator
    assert trainer.evaluate(None) == (3.0, 24)
    assert steps.engine.modes == ["eval", "train"]
