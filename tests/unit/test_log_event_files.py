"""The TensorBoard tags a log line writes, read back from a real event file, and the evaluation
line's exact text (survivors of the mutation run, benchmarks/mutation.sh): a named validation set
(--valid-weighted-split-paths) under BigScience's `lm-loss-validation/NAME/...` tags and its
`NAME loss at` line, evaluation_log writing TensorBoard unless told not to, the 100-dash bars
around the line, and the batch size on the iteration and samples axes only. In-process."""
import math
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from megatron.metrics.training_log import IntervalStats, evaluation_log, training_log
from tests.support.logging_fixtures import CACHE, CONFIG, PROGRESS, Recorder

AXES = ("", " vs samples", " vs tokens", " vs gigaflos (without embeddings)")
STEPS = (12, 96, 3072, 7.5)  # PROGRESS: iteration, samples, tokens, gigaflos


@pytest.fixture
def logged(tmp_path, monkeypatch):
    """One real event file: a training line, an unnamed and a named validation with TensorBoard, a
    named one without. Returns (scalar tag -> [(step, value)], printed text). Per test, not per
    module: mutmut counts a function as reached only by the tests that call it."""
    directory = tmp_path / "tb"
    writer = SummaryWriter(log_dir=str(directory))
    printed = []
    monkeypatch.setattr("megatron.metrics.training_log.print_rank_last", printed.append)
    stats = IntervalStats()
    stats.add(torch.tensor(2.0), samples=8, applied=True)
    training_log(writer, CONFIG, CACHE, stats, 2.0, PROGRESS, lr=3e-4, grad_norm=None, loss_scale=None,
                 global_batch_size=8, total_iterations=100)
    evaluation_log(writer, CONFIG, "iteration 12", 2.5, PROGRESS)  # tensorboard left at its default
    evaluation_log(writer, CONFIG, "iteration 12", 2.5, PROGRESS, name="wiki")
    evaluation_log(writer, CONFIG, "iteration 12", 4.0, PROGRESS, tensorboard=False, name="code")
    writer.close()
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}, printed


def test_validation_tags_named_and_unnamed_on_every_axis(logged):
    scalars, _ = logged
    # event files store steps as integers: the gigaflos axis' 7.5 reads back as 7
    ppl = math.exp(2.5)  # 12.18249...
    for group in ("lm-loss-validation", "lm-loss-validation/wiki"):
        for suffix, step in zip(AXES, STEPS, strict=True):
            assert scalars[f"{group}/lm loss validation{suffix}"] == [(int(step), 2.5)], (group, suffix)
            [(got_step, got)] = scalars[f"{group}/lm loss validation ppl{suffix}"]
            assert got_step == int(step) and got == pytest.approx(ppl, rel=1e-6), (group, suffix)
    # tensorboard=False: nothing of "code"'s
    assert not [tag for tag in scalars if "code" in tag]


def test_exactly_these_tags(logged):
    """The whole set, listed by hand: the batch size on iterations and samples only, the learning
    rate without the gigaflos axis, no grad norm / loss scale / MFU-less extras."""
    scalars, _ = logged
    expected = {"learning-rate/learning-rate" + a for a in AXES[:3]}
    expected |= {"batch-size/batch-size", "batch-size/batch-size vs samples"}
    expected |= {"lm-loss-training/lm loss" + a for a in AXES}
    expected |= {"iteration-time/" + t for t in ("iteration-time", "samples per second",
                                                 "samples per second per replica", "tokens per second",
                                                 "tokens per second per replica", "TFLOPs per gpu (estimated)",
                                                 "MFU")}
    expected |= {f"{g}/lm loss validation{p}{a}" for g in ("lm-loss-validation", "lm-loss-validation/wiki")
                 for p in ("", " ppl") for a in AXES}
    assert set(scalars) == expected
    assert scalars["batch-size/batch-size vs samples"] == [(96, 8.0)]


def test_evaluation_lines_between_100_dash_bars(logged):
    _, printed = logged
    bar = "----------" * 10
    assert printed[1:] == [
        f"{bar}\n validation loss at iteration 12 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 |\n{bar}",
        f"{bar}\n wiki loss at iteration 12 | lm loss value: 2.500000E+00 | lm loss PPL: 1.218249E+01 |\n{bar}",
        f"{bar}\n code loss at iteration 12 | lm loss value: 4.000000E+00 | lm loss PPL: 5.459815E+01 |\n{bar}"]


def test_curriculum_interval_at_two_lengths(capsys):
    """A curriculum changed the length mid-interval: 12 samples at 16 tokens (one of them a skipped
    step's 8: trained, though its loss is left out) and 4 at 32. By hand: 12 x 16 + 4 x 32 = 320
    tokens; FLOPs 12 x 1e11 + 4 x 3e11 = 2.4e12, model FLOPs 12 x 5e10 + 4 x 1e11 = 1e12; in 1 s on
    4 ranks: 16 samples/s, 320 tokens/s (160 per replica, DP 2), 0.6 TFLOPs per GPU, MFU 25 % of
    the 1 TFLOP/s peak. The line and the seqlen tags carry the last length, 32."""
    cache = SimpleNamespace(flops_per_sample=1e12, model_flops_per_sample=5e11,  # --seq-length's: unused
                            flops_per_sample_at={16: 1e11, 32: 3e11}, model_flops_per_sample_at={16: 5e10, 32: 1e11})
    stats = IntervalStats()
    stats.add(torch.tensor(2.0), samples=4, applied=True, seqlen=16)
    stats.add(torch.tensor(9.0), samples=8, applied=False, seqlen=16)
    stats.add(torch.tensor(4.0), samples=4, applied=True, seqlen=32)
    assert stats.samples_at == {16: 12, 32: 4}
    writer = Recorder()
    training_log(writer, CONFIG, cache, stats, 1.0, PROGRESS, lr=3e-4, grad_norm=None, loss_scale=None,
                 global_batch_size=4, total_iterations=100, curriculum_seqlen=32)
    line = capsys.readouterr().out
    for part in (" lm loss: 3.000000E+00 | curriculum seqlen:    32 | number of skipped iterations:   1 |",
                 " samples per second: 16.000 | TFLOPs: 0.60 | MFU: 25.00% |"):
        assert part in line, part
    s = writer.scalars
    assert s["iteration-time/tokens per second"] == {12: 320.0}
    assert s["iteration-time/tokens per second per replica"] == {12: 160.0}
    assert s["iteration-time/TFLOPs per gpu (estimated)"] == {12: pytest.approx(0.6)}
    assert s["iteration-time/MFU"] == {12: 0.25}
    assert {tag: v for tag, v in s.items() if tag.startswith("seqlen/")} == {
        "seqlen/curriculum_seqlen": {12: 32.0}, "seqlen/curriculum_seqlen vs samples": {96: 32.0},
        "seqlen/curriculum_seqlen vs tokens": {3072: 32.0}}


def test_mfu_of_a_one_sample_interval(capsys):
    """One sample of 5e11 model FLOPs in 1 s on 4 ranks of 1 TFLOP/s: 5e11 / 4e12 = 12.5 %."""
    stats = IntervalStats()
    stats.add(torch.tensor(1.0), samples=1, applied=True)
    writer = Recorder()
    training_log(writer, CONFIG, CACHE, stats, 1.0, PROGRESS, lr=3e-4, grad_norm=None, loss_scale=None,
                 global_batch_size=1, total_iterations=100)
    assert " MFU: 12.50% |" in capsys.readouterr().out
    assert writer.scalars["iteration-time/MFU"] == {12: 0.125}


def _event_scalars(directory, config, **values):
    writer = SummaryWriter(log_dir=str(directory))
    stats = IntervalStats()
    stats.add(torch.tensor(2.0), samples=8, applied=True)
    training_log(writer, config, CACHE, stats, 2.0, PROGRESS, lr=3e-4, grad_norm=None, global_batch_size=8,
                 total_iterations=100, **values)
    writer.close()
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_fork_switches_loss_scale_world_size_memory(tmp_path, capsys):
    """The forks' tags (Microsoft's training_log): loss-scale/loss-scale and world-size/world-size
    on the iteration, samples and tokens axes; mem-reserved-bytes, mem-allocated-bytes and
    mem-allocated-count (torch.cuda.memory_stats()'s current values) on iterations; the loss scale
    is on by default and off with --no-log-loss-scale-to-tensorboard, the other two off by default."""
    import dataclasses
    stats = {"reserved_bytes.all.current": 2 ** 20, "allocated_bytes.all.current": 5000,
             "allocation.all.current": 7}
    on = dataclasses.replace(CONFIG, log_world_size_to_tensorboard=True, log_memory_to_tensorboard=True)
    scalars = _event_scalars(tmp_path / "on", on, loss_scale=4096.0, memory_stats=stats)
    for suffix, step in zip(AXES[:3], STEPS[:3], strict=True):
        assert scalars[f"loss-scale/loss-scale{suffix}"] == [(step, 4096.0)]
        assert scalars[f"world-size/world-size{suffix}"] == [(step, 4.0)]  # CONFIG: 4 ranks
    # on the iteration, samples and tokens axes only (not gigaflos)
    for group in ("loss-scale/loss-scale", "world-size/world-size"):
        assert sorted(tag for tag in scalars if tag.startswith(group)) == sorted(group + s for s in AXES[:3])
    assert scalars["mem-reserved-bytes"] == [(12, 1048576.0)]
    assert scalars["mem-allocated-bytes"] == [(12, 5000.0)]
    assert scalars["mem-allocated-count"] == [(12, 7.0)]
    off = dataclasses.replace(CONFIG, log_loss_scale_to_tensorboard=False)
    scalars = _event_scalars(tmp_path / "off", off, loss_scale=4096.0)
    assert not [tag for tag in scalars if tag.startswith(("loss-scale", "world-size", "mem-"))]
    assert " loss scale: 4096.0 |" in capsys.readouterr().out  # the log line keeps it


def test_tensorboard_switch_flags():
    """The flags' spellings and defaults, as both forks declare them."""
    from megatron.config.arguments import parse_args
    from tests.support.validated_args import BASE
    default = parse_args(args_list=BASE)
    assert (default.log_loss_scale_to_tensorboard, default.log_memory_to_tensorboard,
            default.log_world_size_to_tensorboard) == (True, False, False)
    given = parse_args(args_list=BASE + ["--no-log-loss-scale-to-tensorboard", "--log-memory-to-tensorboard",
                                         "--log-world-size-to-tensorboard"])
    assert (given.log_loss_scale_to_tensorboard, given.log_memory_to_tensorboard,
            given.log_world_size_to_tensorboard) == (False, True, True)


def test_memory_to_tensorboard_needs_cuda():
    from megatron.runtime.refusal import ConfigError
    from tests.support.validated_args import validated
    with pytest.raises(ConfigError, match="--log-memory-to-tensorboard logs torch.cuda.memory_stats"):
        validated(["--log-memory-to-tensorboard"], cuda=False)


def test_timing_across_ranks_in_the_log_and_tensorboard(tmp_path, capsys):
    """--timing-log-option minmax with rank 1 the slower (10 ms and 30 ms): Megatron-LM's block with
    the slowest rank named, and the max, min and slowest rank as scalars at the iteration (12)."""
    import dataclasses
    config = dataclasses.replace(CONFIG, timing_log_option="minmax")
    scalars = _event_scalars(tmp_path, config, loss_scale=None, rank_times=[10.0, 30.0])
    assert scalars["iteration-time/iteration-time max (ms)"] == [(12, 30.0)]
    assert scalars["iteration-time/iteration-time min (ms)"] == [(12, 10.0)]
    assert scalars["iteration-time/slowest rank"] == [(12, 1.0)]
    out = capsys.readouterr().out
    assert "(min, max) time across ranks (ms):\n" in out and ": (10.00, 30.00) | slowest rank: 1" in out
    # without the option, no block and no scalar, whatever times are given
    scalars = _event_scalars(tmp_path / "off", CONFIG, loss_scale=None, rank_times=[10.0, 30.0])
    assert not [tag for tag in scalars if "across" in tag or "slowest" in tag or " max (ms)" in tag]
    assert "across ranks" not in capsys.readouterr().out
