"""Megatron-LM's WSD schedule (--lr-decay-style WSD) against values worked out by hand: the
warm-up, the stable phase, each cool-down shape (--lr-wsd-decay-style) and the end, in samples and
in tokens; the flags' lengths and their refusals."""
from types import SimpleNamespace

import pytest

from megatron.config.run_config import LRSchedule
from megatron.runtime.refusal import ConfigError
from megatron.schedules.learning_rates import AnnealingLR
from tests.support.validated_args import validated

# warm-up 10 samples, decay length 110, cool-down the last 40: stable from 10 to 70
MAX, MIN = 1.0, 0.1


def wsd(style, **kw):
    kw = {"warmup_samples": 10, "decay_samples": 110, "wsd_decay_samples": 40, **kw}
    return AnnealingLR(SimpleNamespace(param_groups=[{}]), MAX, MIN, decay_style="WSD", wsd_decay_style=style, **kw)


# the cool-down's coefficient a quarter of the way in (r = 10/40), by hand:
# exponential 2 * 0.5^0.25 - 1, linear 1 - 0.25, cosine (cos(pi/4) + 1) / 2, minus_sqrt 1 - sqrt(0.25)
QUARTER = {"exponential": 2 * 0.8408964152537145 - 1, "linear": 0.75,
           "cosine": (0.7071067811865476 + 1) / 2, "minus_sqrt": 0.5}


@pytest.mark.parametrize("style", sorted(QUARTER))
def test_each_phase_by_hand(style):
    points = {0: 0.0, 5: 0.5, 10: 1.0,            # warm-up: n / 10 of the max
              11: 1.0, 40: 1.0, 70: 1.0,          # stable: the max, up to the cool-down's start
              80: MIN + QUARTER[style] * (MAX - MIN),
              110: MIN, 111: MIN, 500: MIN}       # every shape ends at min-lr; past the decay: min-lr
    schedule, n = wsd(style), 0
    for at, expected in points.items():
        lr = schedule.step(at - n)
        n = at
        assert lr == pytest.approx(expected, rel=1e-12, abs=1e-12), (style, at)


def test_halfway_exponential_and_minus_sqrt():
    # r = 20/40: exponential 2 * 0.5^0.5 - 1 = sqrt(2) - 1; minus_sqrt 1 - sqrt(0.5)
    assert wsd("exponential").step(90) == pytest.approx(MIN + 0.41421356237309515 * 0.9, rel=1e-12)
    assert wsd("minus_sqrt").step(90) == pytest.approx(MIN + (1 - 0.7071067811865476) * 0.9, rel=1e-12)


def test_tokens():
    # 8 tokens a sample; decay 110 x 8 = 880 tokens, cool-down the last 160: r at 800 tokens = 80/160
    schedule = wsd("linear", tokens_per_sample=8, wsd_decay_samples=None, wsd_decay_tokens=160)
    assert schedule.step(90) == 1.0                      # 720 tokens: the cool-down's start
    assert schedule.step(10) == pytest.approx(MIN + 0.5 * 0.9, rel=1e-12)
    # a cool-down given in samples in token mode: 40 x 8 = 320 tokens from 560; 640 tokens: r = 1/4
    schedule = wsd("linear", tokens_per_sample=8, decay_tokens=880)
    assert schedule.step(80) == pytest.approx(MIN + 0.75 * 0.9, rel=1e-12)


def test_a_resume_with_another_cool_down_needs_a_choice():
    saved = wsd("linear")
    saved.step(60)
    state = saved.state_dict()
    with pytest.raises(ConfigError, match="WSD decay style: saved linear vs now cosine"):
        wsd("cosine").load_state_dict(state)
    # a shorter horizon branched off at 60: decay 90, cool-down its last 20 (from 70)
    branch = wsd("cosine", decay_samples=90, wsd_decay_samples=20, override_scheduler=True)
    branch.load_state_dict(state)
    assert branch.get_lr() == 1.0 and branch.step(10) == 1.0
    assert branch.step(5) == pytest.approx(MIN + 0.5 * (1 + 0.7071067811865476) * 0.9, rel=1e-12)  # r = 1/4


def lengths(*extra):
    return LRSchedule.from_args(validated(["--lr-decay-style", "WSD", *extra]))


def test_flags_give_the_lengths():
    # --train-iters 10, global batch 8: iterations x 8 samples
    schedule = lengths("--lr-wsd-decay-iters", 3, "--lr-wsd-decay-style", "cosine")
    assert (schedule.decay_samples, schedule.wsd_decay_samples, schedule.wsd_decay_style) == (80, 24, "cosine")
    assert lengths("--lr-wsd-decay-tokens", 96).wsd_decay_tokens == 96
    assert lengths("--lr-wsd-decay-iters", 3).wsd_decay_style == "exponential"  # Megatron-LM's default
    # --train-samples: the cool-down in samples (Megatron-LM's --lr-wsd-decay-samples)
    from tests.support.validated_args import BASE
    samples = [a for a in BASE if a not in ("--train-iters", "10")] + ["--train-samples", "96"]
    schedule = LRSchedule.from_args(validated(["--lr-decay-style", "WSD", "--lr-wsd-decay-samples", 40], base=samples))
    assert (schedule.decay_samples, schedule.wsd_decay_samples) == (96, 40)
    with pytest.raises(ConfigError, match="--lr-wsd-decay-iters does not go with --train-samples"):
        validated(["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", 4], base=samples)


@pytest.mark.parametrize("extra, line", [
    (["--lr-decay-style", "WSD"],
     "--lr-decay-style WSD needs its cool-down length: --lr-wsd-decay-iters (or --lr-wsd-decay-tokens)"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-samples", 8],
     "--lr-wsd-decay-samples does not go with --train-iters: give the WSD cool-down with --lr-wsd-decay-iters "
     "(or --lr-wsd-decay-tokens)"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", 11],  # 88 samples, the decay 80
     "the WSD cool-down (88 samples) is longer than the decay after the warmup (80 samples): shorten "
     "--lr-wsd-decay-iters or lengthen the decay"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-tokens", 2561],  # 80 samples x 32 tokens = 2560
     "the WSD cool-down (2561 tokens) is longer than the decay after the warmup (2560 tokens): shorten "
     "--lr-wsd-decay-iters or lengthen the decay"),
    (["--lr-wsd-decay-iters", 2],
     "--lr-wsd-decay-iters is WSD's cool-down: add --lr-decay-style WSD or drop it"),
])
def test_refusals(extra, line):
    with pytest.raises(ConfigError) as e:
        validated(extra)
    assert str(e.value) == line
