"""--start-weight-decay / --end-weight-decay / --weight-decay-incr-style as Megatron's
OptimizerParamScheduler.get_wd does it, worked by hand: the run is 10 iterations of 10 samples
(wd_incr_steps = 100 samples), from 0.02 to 0.1.
  linear:  0.02 + 0.08 x samples / 100: after iteration 3 (30 samples) 0.044, after 5 0.06
  cosine:  0.02 + 0.08 x (cos(pi (1 - r)) + 1) / 2: r = 0.25 -> 0.02 + 0.08 x 0.1464466 = 0.0317157;
           r = 0.5 -> 0.06; r = 0.75 -> 0.02 + 0.08 x 0.8535534 = 0.0882843
  past the run (an iteration 11): 0.1
Only the groups built with weight decay (wd_mult 1) move; the biases and norms stay at 0."""
import pytest
import torch

from megatron.runtime.refusal import ConfigError
from megatron.schedules.learning_rates import AnnealingLR
from tests.support.validated_args import validated


def _scheduler(style, start=0.02, end=0.1):
    w, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.5, "wd_mult": 1.0},
                             {"params": [b], "weight_decay": 0.0, "wd_mult": 0.0}], lr=1.0)
    return AnnealingLR(opt, 1e-3, 0.0, 0, 100, "constant", start_wd=start, end_wd=end, wd_incr_samples=100,
                       wd_incr_style=style), opt


def _decays(sched, opt, iterations):
    out = {}
    for it in range(1, iterations + 1):
        sched.step(10)
        out[it] = [g["weight_decay"] for g in opt.param_groups]
    return out


def test_linear_and_cosine_by_hand():
    sched, opt = _scheduler("linear")
    assert [g["weight_decay"] for g in opt.param_groups] == [pytest.approx(0.02), 0.0]  # at 0 samples
    got = _decays(sched, opt, 11)
    assert got[3] == [pytest.approx(0.044), 0.0] and got[5] == [pytest.approx(0.06), 0.0]
    assert got[10] == [pytest.approx(0.1), 0.0] and got[11] == [pytest.approx(0.1), 0.0]
    sched, opt = _scheduler("cosine")
    got = _decays(sched, opt, 11)
    assert got[5][0] == pytest.approx(0.06)
    sched, opt = _scheduler("cosine")
    sched.step(25)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.0317157, abs=1e-7)
    sched.step(50)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.0882843, abs=1e-7)


def test_resumed_from_the_saved_state_and_checked():
    """A scheduler rebuilt from the flags and loaded from the state at iteration 3 goes on as the
    uninterrupted one; a checkpoint saved with another increment style is refused in one line."""
    sched, opt = _scheduler("linear")
    _decays(sched, opt, 3)
    state = sched.state_dict()
    assert (state["start_wd"], state["end_wd"], state["wd_incr_steps"], state["wd_incr_style"]) == \
        (0.02, 0.1, 100, "linear")
    resumed, opt2 = _scheduler("linear")
    resumed.load_state_dict(state)
    assert opt2.param_groups[0]["weight_decay"] == pytest.approx(0.044)
    resumed.step(10)
    assert opt2.param_groups[0]["weight_decay"] == pytest.approx(0.052)
    other, _ = _scheduler("cosine")
    with pytest.raises(ConfigError, match="weight decay increment style: saved linear vs now cosine"):
        other.load_state_dict(state)
    longer, _ = _scheduler("linear")
    longer.wd_incr_samples = 200  # a longer run moves a linear increment: refused as Megatron does
    with pytest.raises(ConfigError, match="weight decay increment samples: saved 100 vs now 200"):
        longer.load_state_dict(state)
    constant, _ = _scheduler("constant", start=0.1, end=0.1)
    constant_state = constant.state_dict()
    longer, opt = _scheduler("constant", start=0.1, end=0.1)
    longer.wd_incr_samples = 200  # ... a constant one not: the longer run resumes
    longer.load_state_dict(constant_state)
    assert opt.param_groups[0]["weight_decay"] == 0.1


def test_flags_as_megatron_checks_them():
    args = validated(["--weight-decay-incr-style", "linear", "--start-weight-decay", "0.01",
                      "--end-weight-decay", "0.1"])
    from megatron.config.run_config import LRSchedule
    schedule = LRSchedule.from_args(args)  # --train-iters 10 x --global-batch-size 8
    assert (schedule.start_wd, schedule.end_wd, schedule.wd_incr_samples, schedule.wd_incr_style) == \
        (0.01, 0.1, 80, "linear")
    constant = LRSchedule.from_args(validated(["--weight-decay", "0.3"]))
    assert (constant.start_wd, constant.end_wd) == (0.3, 0.3)
    for extra, message in ((["--start-weight-decay", "0.1"], "need --weight-decay-incr-style linear or cosine"),
                           (["--weight-decay-incr-style", "cosine", "--end-weight-decay", "0.1"],
                            "needs --start-weight-decay and --end-weight-decay"),
                           (["--weight-decay-incr-style", "linear", "--start-weight-decay", "0.2",
                             "--end-weight-decay", "0.1"], "only increases")):
        with pytest.raises(ConfigError, match=message):
            validated(extra)


# survivors of the mutation run (benchmarks/mutation.sh learning_rates), each value by hand


def test_constant_style_is_end_wd_at_every_point():
    # the docstring's "constant: end_wd" (Megatron asserts start == end there): no ramp is computed
    from megatron.schedules.learning_rates import weight_decay_at
    assert [weight_decay_at(s, 0.02, 0.1, 100, "constant") for s in (0, 30, 100, 150)] == [0.1] * 4


def _groups_and_opt():
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.AdamW([{"params": [w], "weight_decay": 0.5, "wd_mult": 1.0},
                              {"params": [b], "weight_decay": 0.0}], lr=1.0)


@pytest.mark.parametrize("start, end, incr", [(None, None, None), (0.02, 0.1, None), (None, 0.1, 100),
                                              (0.02, None, 100)])
def test_no_increment_leaves_the_groups_weight_decay(start, end, incr):
    # any of the three missing: no increment (get_wd None), the groups keep their 0.5 and 0.0
    opt = _groups_and_opt()
    sched = AnnealingLR(opt, 1e-3, 0.0, 0, 100, "constant", start_wd=start, end_wd=end, wd_incr_samples=incr,
                        wd_incr_style="linear")
    sched.step(30)
    assert sched.get_wd() is None
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]


def test_increment_moves_only_groups_with_wd_mult():
    # linear from 0.02 to 0.1 over 100: at 30 samples 0.02 + 0.08 x 0.3 = 0.044 (wd_mult 1); the group
    # without wd_mult keeps its 0.0
    opt = _groups_and_opt()
    AnnealingLR(opt, 1e-3, 0.0, 0, 100, "constant", start_wd=0.02, end_wd=0.1, wd_incr_samples=100,
                wd_incr_style="linear").step(30)
    assert [g["weight_decay"] for g in opt.param_groups] == [pytest.approx(0.044), 0.0]


def test_checkpoint_saved_before_the_increment_existed_loads():
    # such a state has none of start_wd / end_wd / wd_incr_steps / wd_incr_style: they are not checked
    # (here the flags' constant style and 0.1 against the absent keys); the rest still is
    sched, opt = _scheduler("constant", start=0.1, end=0.1)
    state = {k: v for k, v in sched.state_dict().items()
             if k not in ("start_wd", "end_wd", "wd_incr_steps", "wd_incr_style")}
    state["num_steps"] = 30
    sched.load_state_dict(state)
    assert sched.num_samples == 30 and opt.param_groups[0]["weight_decay"] == 0.1
    del state["decay_style"]  # a schedule key missing is still a difference
    with pytest.raises(ConfigError, match="decay style: saved None vs now constant"):
        _scheduler("constant", start=0.1, end=0.1)[0].load_state_dict(state)


def test_run_length_in_samples():
    from types import SimpleNamespace

    from megatron.schedules.learning_rates import weight_decay_samples
    base = dict(global_batch_size=8, micro_batch_size=1, data_parallel_size=1, rampup_batch_size=None,
                seq_length=10, train_tokens=None)
    # --train-iters 10 x 8 = 80; --train-samples 100 as given (not rounded up to 13 x 8 = 104)
    assert weight_decay_samples(SimpleNamespace(train_iters=10, train_samples=None, **base)) == 80
    assert weight_decay_samples(SimpleNamespace(train_iters=None, train_samples=100, **base)) == 100
    # neither: the run's length, here --train-tokens 1000 of 8 x 10 tokens an iteration:
    # ceil(1000 / 80) = 13 iterations x 8 = 104 samples
    assert weight_decay_samples(SimpleNamespace(train_iters=None, train_samples=None,
                                                **{**base, "train_tokens": 1000})) == 104


def test_the_last_sample_of_the_increment_takes_megatrons_formula():
    """At samples == the increment's length Megatron's get_wd has not returned end_wd yet (`>`, not
    `>=`): the ramp's value there is start + 1.0 * (end - start), which in floating point is not
    always end (0.033 + (0.317 - 0.033) = 0.31700000000000006)."""
    from megatron.schedules.learning_rates import weight_decay_at
    assert 0.033 + 1.0 * (0.317 - 0.033) == 0.31700000000000006  # the arithmetic, by hand
    for style in ("linear", "cosine"):  # both coefficients are exactly 1.0 at the end
        assert weight_decay_at(80, 0.033, 0.317, 80, style) == 0.31700000000000006
    assert weight_decay_at(81, 0.033, 0.317, 80, "linear") == 0.317  # past it: end_wd itself
