"""The learning-rate schedule (logged every iteration) against values derived by hand."""
import math

import pytest

from megatron.learning_rates import AnnealingLR


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
