"""The log line, the TensorBoard scalars and the evaluation mean, with every number worked out by
hand from chosen inputs (in-process: no launch). The launch tests read these values back from real
runs, but mostly compare them with other numbers the same run printed; here each one is written
out: the interval's mean loss without the skipped iteration, samples / tokens per second, per
replica, TFLOPs per GPU, MFU, the validation perplexity exp(min(20, loss)) and the mean over
--eval-iters batches."""
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from megatron.metrics.processor import MetricsProcessor
from megatron.metrics.training_log import IntervalStats
from tests.support.logging_fixtures import CACHE, CONFIG, PROGRESS, Recorder


@pytest.fixture
def writer():
    return Recorder()


@pytest.fixture
def metrics(writer):
    """The run's metrics object, writing into the recorder instead of a SummaryWriter."""
    return MetricsProcessor(CONFIG, cache=CACHE, writer=writer)

def test_training_line_and_scalars_by_hand(metrics, writer, capsys):
    stats = IntervalStats()
    stats.add(torch.tensor(2.0), samples=8, applied=True)
    stats.add(torch.tensor(100.0), samples=8, applied=False)  # an overflow step: its loss is not the model's
    stats.add(torch.tensor(4.0), samples=8, applied=True)
    metrics.log_training(stats, elapsed=2.0, lr=3e-4, grad_norm=torch.tensor(1.25), loss_scale=None,
                         global_batch_size=8, progress=PROGRESS, total_iterations=100)
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
def test_validation_line_and_perplexity_by_hand(metrics, writer, capsys, loss, ppl):
    """exp(2.5) = 12.18249396...; a loss above 20 is capped at exp(20) (Megatron's overflow guard)."""
    metrics.log_evaluation("iteration 12", loss, PROGRESS)
    out = capsys.readouterr().out
    assert f" validation loss at iteration 12 | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} |" in out
    s = writer.scalars
    assert s["lm-loss-validation/lm loss validation"] == {12: loss}
    assert s["lm-loss-validation/lm loss validation ppl"] == {12: pytest.approx(ppl, rel=1e-6)}
    assert s["lm-loss-validation/lm loss validation ppl vs samples"] == {96: pytest.approx(ppl, rel=1e-6)}


def test_metrics_owns_its_writer_and_decides_when_to_log(tmp_path):
    """With --tensorboard-dir on the writing rank, the MetricsProcessor opens a real SummaryWriter
    and closing it leaves the scalars in an event file; a rank that does not write opens none;
    should_log follows --log-interval."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    config = dataclasses.replace(CONFIG, log_interval=5, tensorboard_dir=str(tmp_path / "tb"), writes_tensorboard=True)
    metrics = MetricsProcessor(config, cache=CACHE)
    assert [i for i in range(1, 16) if metrics.should_log(i)] == [5, 10, 15]
    metrics.log_evaluation("iteration 12", 2.5, PROGRESS)
    metrics.close()
    metrics.close()  # the run's end and an early exit may both close it: the second does nothing
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("lm-loss-validation/lm loss validation")] == [(12, 2.5)]
    quiet = dataclasses.replace(config, tensorboard_dir=str(tmp_path / "quiet"), writes_tensorboard=False)
    MetricsProcessor(quiet, cache=CACHE).close()
    assert not (tmp_path / "quiet").exists()


def test_evaluation_is_the_mean_over_eval_iters():
    """Three batches with losses 1, 2 and 6: mean 3; 3 batches of the current global batch 8 read."""
    from megatron.config.run_config import EvaluationSettings
    from megatron.training.trainer import Trainer

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
