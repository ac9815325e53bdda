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


# survivors of the mutation run (benchmarks/mutation.sh learning_rates), each value by hand


def test_default_cool_down_shape_is_exponential():
    # Megatron-LM's --lr-wsd-decay-style default; r = 10/40 at 80: 2 * 0.5^0.25 - 1 = 0.6817928305074290
    schedule = AnnealingLR(SimpleNamespace(param_groups=[{}]), MAX, MIN, 10, 110, "WSD", wsd_decay_samples=40)
    assert schedule.step(80) == pytest.approx(MIN + (2 * 0.8408964152537145 - 1) * (MAX - MIN), rel=1e-12)


def test_zero_cool_down_stays_at_max_through_the_decay_length():
    # Megatron-LM: num_steps > decay -> min_lr; else anneal_start = decay - wsd_decay = 110 - 0 = 110,
    # num_steps <= 110 -> coeff 1 -> max_lr. --lr-wsd-decay-iters 0 passes validation (0 <= room).
    schedule = wsd("linear", wsd_decay_samples=0)
    assert schedule.step(110) == MAX  # n = decay = the cool-down's start: stable, no 0/0
    assert schedule.step(1) == MIN    # 111 > 110


def test_sample_mode_cool_down_ignores_tokens_per_sample():
    # no token length given: samples; the cool-down is the last 40 samples (not 40 x 4), from 70;
    # at 80: r = 10/40, linear 0.75
    schedule = wsd("linear", tokens_per_sample=4)
    assert schedule.step(70) == MAX
    assert schedule.step(10) == pytest.approx(MIN + 0.75 * (MAX - MIN), rel=1e-12)


def test_cool_down_lengths_only_with_wsd():
    # a cosine schedule given WSD's lengths (as the run config passes them) keeps none of them: it
    # stays in sample mode (no token position saved) and resumes from its own state
    kw = dict(warmup_samples=0, decay_samples=10, decay_style="cosine", tokens_per_sample=4,
              wsd_decay_samples=4, wsd_decay_tokens=16)
    cosine = AnnealingLR(SimpleNamespace(param_groups=[{}]), MAX, MIN, **kw)
    assert (cosine.wsd_decay_samples, cosine.wsd_decay_tokens, cosine.token_based) == (None, None, False)
    cosine.step(5)  # r = 5/10: 0.1 + 0.5 x (cos(pi/2) + 1) x 0.9 = 0.55
    state = cosine.state_dict()
    assert state["num_tokens"] is None and "wsd_decay_steps" not in state
    resumed = AnnealingLR(SimpleNamespace(param_groups=[{}]), MAX, MIN, **kw)
    resumed.load_state_dict(state)
    assert resumed.get_lr() == pytest.approx(0.55, rel=1e-12)


def test_state_dict_keys_and_round_trip():
    state = wsd("linear").state_dict()
    assert (state["wsd_decay_steps"], state["wsd_decay_tokens"], state["lr_wsd_decay_style"]) == (40, None, "linear")
    saved = wsd("linear", tokens_per_sample=8, wsd_decay_samples=None, wsd_decay_tokens=160)
    saved.step(90)
    state = saved.state_dict()
    assert (state["wsd_decay_steps"], state["wsd_decay_tokens"]) == (None, 160)
    fresh = wsd("linear")
    fresh.load_state_dict(fresh.state_dict())  # its own state: no refusal
    resumed = wsd("linear", tokens_per_sample=8, wsd_decay_samples=None, wsd_decay_tokens=160)
    resumed.load_state_dict(state)
    assert resumed.step(10) == pytest.approx(MIN + 0.5 * 0.9, rel=1e-12)  # 800 tokens: r = 80/160
    with pytest.raises(ConfigError, match="WSD decay tokens: saved 160 vs now 120"):
        wsd("linear", tokens_per_sample=8, wsd_decay_samples=None, wsd_decay_tokens=120).load_state_dict(state)
    with pytest.raises(ConfigError, match="WSD decay samples: saved 40 vs now 20"):
        wsd("linear", wsd_decay_samples=20).load_state_dict(wsd("linear").state_dict())
