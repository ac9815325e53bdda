"""Three of issue 39's features through real runs, one launch asserting as much as it can:

* WSD (--lr-decay-style WSD): a 2-rank run stopped mid-cool-down (--exit-interval) and resumed on
  2 ranks logs the learning rates of an uninterrupted run (one rank, in-process: it never took the
  resume path), and both equal the schedule worked out by hand;
* --log-progress: progress.txt in --save carries, across the resume and a change of layout (2
  ranks -> 1), each checkpoint's tokens and floating-point operations: the sums over the logged
  iterations (tokens as the log line gives them; FLOPs per sample by hand below), and a
  'Starting job' line per job with its number of ranks;
* --timing-log-option: one rank is made slower on purpose (the driver's DRIVER_SLOW_RANK sleeps at
  the end of its steps); every log names it as the slowest, in the log and in TensorBoard, and the
  ranks' times printed agree with the ones each rank recorded for itself (no wall-clock threshold).
"""
import math
import os
import re

import pytest

from megatron.training import TrainerHooks
from tests.support.launcher import TINY, launch

# global batch 4 (2 ranks x micro batch 2), 8 iterations: warm-up 1 iteration (4 samples), decay
# length 8 (32 samples), the cool-down its last 4 iterations (from 16 samples), cosine, min-lr 0
MAX = 3e-3
BASE = (TINY[:TINY.index("--lr")] + TINY[TINY.index("--lr-warmup-iters") + 2:]
        + ["--lr", MAX, "--lr-warmup-iters", 1, "--global-batch-size", 4, "--train-iters", 8,
           "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", 4, "--lr-wsd-decay-style", "cosine",
           "--eval-iters", 0, "--log-progress", "--save-interval", 2])


def lr_by_hand(iteration):
    """The LR logged after iteration i: the schedule at n = 4i samples."""
    n = 4 * iteration
    if n <= 4:
        return MAX * n / 4
    if n <= 16:
        return MAX
    return MAX * 0.5 * (math.cos(math.pi * (n - 16) / 16) + 1)


# the model FLOPs of one sample, by hand (2 layers, h 64, s 32, 4 heads of 64 / 4, ffn 256, the vocab
# 600 padded to 640): per layer QKV 2 s h 3h, scores and context 4 s^2 h, projection 2 s h^2, MLP 4 s h f;
# the logits 2 s h V; backward twice the forward
S, H, F, V = 32, 64, 256, 640
PER_LAYER = 2 * S * H * 3 * H + 4 * S * S * H + 2 * S * H * H + 4 * S * H * F
FLOPS_PER_SAMPLE = 3 * (2 * PER_LAYER + 2 * S * H * V)
assert FLOPS_PER_SAMPLE == 28_311_552


def progress_lines(save_dir):
    with open(os.path.join(save_dir, "progress.txt")) as f:
        return [line.rstrip("\n").split("\t") for line in f]


def fields(tokens):
    return dict(t.split(": ", 1) for t in tokens[4:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wsd")
    save, tb = str(tmp / "ckpt"), str(tmp / "tb")
    os.environ["DRIVER_SLOW_RANK"] = "1:0.3"
    try:  # iterations 1-6 (saves at 2, 4, 6): stopped 2 iterations into the cool-down
        first, first_ranks = launch(2, BASE + ["--save", save, "--exit-interval", 6, "--timing-log-option", "all",
                                               "--tensorboard-dir", tb], str(tmp / "a"))
        os.environ["DRIVER_SLOW_RANK"] = "0:0.3"  # resumed: 7 (saved at its exit), rank 0 the slow one
        second, second_ranks = launch(2, BASE + ["--save", save, "--load", save, "--exit-interval", 7,
                                                 "--timing-log-option", "minmax"], str(tmp / "b"))
    finally:
        del os.environ["DRIVER_SLOW_RANK"]
    return {"tmp": tmp, "save": save, "tb": tb, "first": (first.stdout, first_ranks),
            "second": (second.stdout, second_ranks)}


class _Rates(TrainerHooks):
    def __init__(self):
        self.lrs = {}

    def on_log_start(self, trainer, stats, lr):
        self.lrs[trainer.progress.iteration] = lr


def in_process(flags, entry_point):
    """pretrain_gpt.main on one rank in this process (the entry_point fixture's world of one):
    {iteration: the learning rate logged}."""
    import pretrain_gpt
    rates = _Rates()
    pretrain_gpt.main([str(f) for f in flags], hooks=rates)
    return rates.lrs


def test_wsd_resumed_mid_cool_down_logs_the_uninterrupted_rates(runs, entry_point, tmp_path):
    first, second = runs["first"][1][1], runs["second"][1][1]
    resumed = {**{int(k): v for k, v in first["lrs"].items()}, **{int(k): v for k, v in second["lrs"].items()}}
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6, 7]
    whole = in_process(BASE + ["--save", tmp_path / "whole"], entry_point)
    assert sorted(whole) == list(range(1, 9))
    for it in range(1, 9):
        assert whole[it] == pytest.approx(lr_by_hand(it), rel=1e-12, abs=1e-15), it
        if it in resumed:
            assert resumed[it] == whole[it], it  # the same float: the same schedule at the same position


def test_progress_file_across_resume_and_layout_change(runs, entry_point):
    save = runs["save"]
    # a third job on one rank (a change of layout) loads iteration 7 and finishes at 8
    in_process(BASE + ["--save", save, "--load", save], entry_point)
    lines = progress_lines(save)
    kinds = [(t[2], t[3]) for t in lines]
    started, saved = ("# GPUs: 2", "Starting job"), ("# GPUs: 2", "Saved checkpoint")
    assert kinds == [started, saved, saved, saved, started, saved, ("# GPUs: 1", "Starting job"),
                     ("# GPUs: 1", "Saved checkpoint")]
    logged = {**runs["first"][1][0]["tokens"], **runs["second"][1][0]["tokens"]}
    checkpoints = [fields(t) for t in lines if t[3] == "Saved checkpoint"]
    assert [int(c["Iteration"]) for c in checkpoints] == [2, 4, 6, 7, 8]
    for c in checkpoints:
        it = int(c["Iteration"])
        # each logged iteration trained 4 samples of 32 tokens: their sum, as the log line counts them
        if str(it) in logged:
            assert int(c["Tokens"]) == logged[str(it)]
        assert int(c["Tokens"]) == 4 * 32 * it
        assert float(c["Tokens (in billions)"]) == 4 * 32 * it / 1e9
        assert int(c["Floating-point operations"]) == 4 * it * FLOPS_PER_SAMPLE
        for rate in ("Job throughput", "Cumulative throughput"):
            assert c[rate].endswith(" TFLOP/s/GPU") and float(c[rate].split()[0]) > 0


def _blocks(out, header):
    return re.findall(re.escape(header) + r"\n((?:  .*\n)+)", out)


def test_timing_names_the_slow_rank(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, ranks = runs["first"]
    blocks = _blocks(out, "times across ranks (ms):")
    assert len(blocks) == 6  # one per logged iteration
    for it, block in enumerate(blocks, start=1):
        times = [float(t) for t in re.findall(r"rank +\d+: ([0-9.]+)", block)]
        assert block.endswith("  slowest rank: 1\n") and times[1] > times[0]
        # what each rank recorded around its own step agrees on which one was slower
        own = [ranks[r]["step_times"][str(it)][1] - ranks[r]["step_times"][str(it)][0] for r in (0, 1)]
        assert own[1] > own[0], it
    events = EventAccumulator(runs["tb"], size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("iteration-time/slowest rank")] == [1.0] * 6
    for it in range(6):
        per_rank = [events.Scalars(f"iteration-time/iteration-time rank {r} (ms)")[it].value for r in (0, 1)]
        assert events.Scalars("iteration-time/iteration-time max (ms)")[it].value == max(per_rank) == per_rank[1]
    out, ranks = runs["second"]
    lines = re.findall(r"\(min, max\) time across ranks \(ms\):\n +interval-time \.+: \(([0-9.]+), ([0-9.]+)\) "
                       r"\| slowest rank: (\d)\n", out)
    assert len(lines) == 1 and lines[0][2] == "0" and float(lines[0][0]) <= float(lines[0][1])
    own = [ranks[r]["step_times"]["7"][1] - ranks[r]["step_times"]["7"][0] for r in (0, 1)]
    assert own[0] > own[1]
