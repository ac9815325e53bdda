"""The learning-rate schedule (logged every iteration) against values derived by hand."""
import math

import pytest

from megatron.schedules.learning_rates import AnnealingLR


class _Optimizer:
    def __init__(self):
        self.param_groups = [{"lr": None}, {"lr": None}]


def lr_after(samples, style, warmup=10, decay=110, max_lr=1.0, min_lr=0.1):
    optimizer = _Optimizer()
    schedule = AnnealingLR(optimizer, max_lr, min_lr, warmup, decay, style)
    lr = schedule.step(samples)
    assert all(group["lr"] == lr for group in optimizer.param_groups)
    return lr


@pytest.mark.parametrize("samples, style, expected", [
    (5, "linear", 0.5),                                     # warmup: 5/10 of max
    (10, "cosine", 1.0),                                    # end of warmup
    (60, "linear", 0.1 + 0.9 * (1 - 50 / 100)),             # halfway through decay
    (35, "cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 25 / 100))),
    (60, "cosine", 0.1 + 0.9 * 0.5),
    (200, "linear", 0.1),                                   # past decay: min-lr
    (200, "constant", 1.0),
])
def test_schedule_values(samples, style, expected):
    assert lr_after(samples, style) == pytest.approx(expected, rel=1e-12)


def test_state_round_trip():
    a = AnnealingLR(_Optimizer(), 1.0, 0.1, 10, 110, "cosine")
    a.step(37)
    b = AnnealingLR(_Optimizer(), 1.0, 0.1, 10, 110, "cosine")
    b.load_state_dict(a.state_dict())
    assert b.get_lr() == a.get_lr() and b.num_samples == 37


def _token_schedule(warmup_tokens=None, decay_tokens=None, warmup=10, decay=110, **resume):
    # 8 tokens per sample; lengths not given in tokens are converted from samples
    return AnnealingLR(_Optimizer(), 1.0, 0.1, warmup, decay, "linear", tokens_per_sample=8,
                       warmup_tokens=warmup_tokens, decay_tokens=decay_tokens, **resume)


@pytest.mark.parametrize("samples, warmup_tokens, decay_tokens, expected", [
    (5, 100, 900, 40 / 100),                         # 5 x 8 = 40 of 100 warmup tokens
    (50, 100, 900, 0.1 + 0.9 * (1 - 300 / 800)),     # 400 tokens: 300 of the 800 decay tokens
    (120, 100, 900, 0.1),                            # 960 tokens, past the decay
    (5, None, 900, 0.5),                             # warmup in samples: 40 of its 80 tokens
    (50, None, 900, 0.1 + 0.9 * (1 - 320 / 820)),    # decay from 80 tokens to 900
    (50, 100, None, 0.1 + 0.9 * (1 - 300 / 780)),    # decay in samples: 110 x 8 = 880 tokens
])
def test_token_lengths_override_sample_lengths(samples, warmup_tokens, decay_tokens, expected):
    schedule = _token_schedule(warmup_tokens, decay_tokens)
    assert schedule.step(samples) == pytest.approx(expected, rel=1e-12)


def test_resume_with_another_schedule_needs_a_choice():
    """Both forks: a checkpoint's schedule that differs from the flags' stops the load, unless
    --override-opt_param-scheduler (the flags win) or --use-checkpoint-opt_param-scheduler (the
    checkpoint wins); the position (samples consumed) comes from the checkpoint either way."""
    from megatron.runtime.refusal import ConfigError
    saved = _token_schedule(100, 900)
    saved.step(50)
    state = saved.state_dict()
    with pytest.raises(ConfigError, match=r"decay tokens: saved 900 vs now 500.*--override-opt_param-scheduler"):
        _token_schedule(100, 500).load_state_dict(state)
    flags_win = _token_schedule(100, 500, override_scheduler=True)
    flags_win.load_state_dict(state)
    assert flags_win.get_lr() == pytest.approx(0.1 + 0.9 * (1 - 300 / 400), rel=1e-12)  # 400 of 500 tokens
    saved_wins = _token_schedule(100, 500, use_checkpoint_scheduler=True)
    saved_wins.load_state_dict(state)
    assert saved_wins.get_lr() == pytest.approx(0.1 + 0.9 * (1 - 300 / 800), rel=1e-12)
    same = _token_schedule(100, 900)
    same.load_state_dict(state)
    assert same.num_samples == 50
