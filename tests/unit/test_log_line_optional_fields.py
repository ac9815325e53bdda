"""The log line's and TensorBoard's optional fields, worked out by hand (survivors of the mutation
run, benchmarks/mutation.sh): the MoE loss, the loss scale, --log-num-zeros-in-grad and
--log-params-norm, each in the line and under its tags on its axes; the mean of one applied
iteration; and the model-size scalars and text written once at step 0. In-process."""
from types import SimpleNamespace

import torch

from megatron.metrics.processor import MetricsProcessor
from megatron.metrics.training_log import IntervalStats, log_model_size
from tests.support.logging_fixtures import CACHE, CONFIG, PROGRESS, Recorder


def test_optional_fields_in_the_line_and_their_tags(capsys):
    writer = Recorder()
    stats = IntervalStats()
    stats.add(torch.tensor(3.0), samples=4, applied=True, moe_loss=torch.tensor(0.25))
    stats.add(torch.tensor(9.0), samples=4, applied=False, moe_loss=torch.tensor(7.0))  # skipped: left out
    stats.add(torch.tensor(5.0), samples=4, applied=True, moe_loss=torch.tensor(0.75))
    MetricsProcessor(CONFIG, cache=CACHE, writer=writer).log_training(
        stats, elapsed=1.0, lr=1e-3, grad_norm=None, loss_scale=4096.0, global_batch_size=4, progress=PROGRESS,
        total_iterations=20, params_norm=12.3456, num_zeros=17)
    line = capsys.readouterr().out
    assert (" lm loss: 4.000000E+00 | moe loss: 5.000000E-01 | loss scale: 4096.0 | num zeros: 17.0 |"
            " params norm: 12.346 | number of skipped iterations:   1 |") in line
    assert "grad norm" not in line
    s = writer.scalars
    on_all_axes = {12: None, 96: None, 3072: None}  # iteration, samples, tokens
    assert s["lm-loss-training/moe loss"] == {12: 0.5}
    assert s["lm-loss-training/moe loss vs samples"] == {96: 0.5}
    assert s["lm-loss-training/moe loss vs tokens"] == {3072: 0.5}
    assert s["lm-loss-training/moe loss vs gigaflos (without embeddings)"] == {7.5: 0.5}
    assert s["loss-scale/loss-scale"] == {12: 4096.0}
    for tag, value in (("num-zeros/num-zeros", 17.0), ("params-norm/params-norm", 12.3456),
                       ("learning-rate/learning-rate", 1e-3)):
        got = {step: v for suffix in ("", " vs samples", " vs tokens") for step, v in s[tag + suffix].items()}
        assert got.keys() == on_all_axes.keys() and all(abs(v - value) < 1e-6 for v in got.values()), tag
        assert tag + " vs gigaflos (without embeddings)" not in s, tag


def test_one_applied_iteration_is_its_own_mean():
    stats = IntervalStats()
    stats.add(torch.tensor(3.0), samples=1, applied=True, moe_loss=torch.tensor(0.5))
    assert (stats.mean_loss(), stats.mean_moe_loss(), stats.skipped) == (3.0, 0.5, 0)
    assert IntervalStats().mean_moe_loss() is None


class TextRecorder(Recorder):
    def add_text(self, tag, text, step):
        self.text = (tag, text, step)


def test_model_size_scalars_and_exact_text_at_step_0():
    cache = SimpleNamespace(parameters=51_500_032, parameters_no_embedding=25_220_096,
                            parameters_active=30_000_000, parameters_active_no_embedding=4_000_000)
    dense, moe = TextRecorder(), TextRecorder()
    log_model_size(dense, cache, False, ["parameters: 51,500,032", "stage 0: 1"])
    log_model_size(moe, cache, True, ["x"])
    assert dense.scalars == {"model/parameters": {0: 51_500_032.0},
                             "model/parameters without embeddings": {0: 25_220_096.0}}
    assert dense.text == ("model/parameters (exact)", "    parameters: 51,500,032\n    stage 0: 1", 0)
    assert moe.scalars["model/parameters active"] == {0: 30_000_000.0}
    assert moe.scalars["model/parameters active without embeddings"] == {0: 4_000_000.0}
