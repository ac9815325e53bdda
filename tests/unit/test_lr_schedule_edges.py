"""The LR schedule at its edges (survivors of the mutation run, benchmarks/mutation.sh): no warmup,
a one-sample warmup, a one-sample decay window, the state dict's keys in token mode and the exact
resume refusal, each value worked out by hand. In-process, with a bare param_groups holder."""
from types import SimpleNamespace

import pytest

from megatron.runtime.refusal import ConfigError
from megatron.schedules.learning_rates import AnnealingLR, schedule_lengths


def schedule(**kw):
    opt = SimpleNamespace(param_groups=[{}, {}])
    kw = {"max_lr": 1.0, "min_lr": 0.0, "warmup_samples": 0, "decay_samples": 10, "decay_style": "linear", **kw}
    return AnnealingLR(opt, **kw), opt


def test_no_warmup_starts_at_max_lr():
    lr, opt = schedule()  # warmup 0: no 0/0 at the first step, the decay starts at max_lr
    assert opt.param_groups == [{"lr": 1.0}, {"lr": 1.0}]
    assert lr.step(5) == 0.5  # linear: 1 - 5/10


def test_one_sample_warmup_starts_at_zero():
    lr, _ = schedule(warmup_samples=1, decay_samples=5)
    assert lr.get_lr() == 0.0       # n = 0 of a 1-sample warmup
    assert lr.step(1) == 1.0        # the warmup's end
    assert lr.step(2) == 0.5        # linear over the 4 samples after the warmup: 1 - 2/4


def test_one_sample_decay_window_ends_at_min_lr():
    lr, _ = schedule(warmup_samples=2, decay_samples=3, min_lr=0.25)
    lr.step(2)
    assert lr.step(1) == 0.25       # n = decay: (n - warmup) / (decay - warmup) = 1
    lr, _ = schedule(warmup_samples=2, decay_samples=3, min_lr=0.25, decay_style="cosine")
    lr.step(2)
    assert lr.step(1) == 0.25


def test_the_end_of_a_warmup_longer_than_the_decay():
    """Sample-mode flags that validation accepts: warm-up over 8 samples, decay over 4 (token mode
    refuses that order; Megatron-LM asserts against it). As Megatron-LM's scheduler reads it, the
    warm-up comes first (n <= warmup), so at its end, n = 8 past the decay's 4, the LR is the
    warm-up's 1e-3 x 8 / 8 = 1e-3, not --min-lr 1e-5; after it, past the decay, --min-lr."""
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--micro-batch-size", "2", "--global-batch-size", "4", "--mock-data", "--vocab-size", "600",
             "--lr", "1e-3", "--min-lr", "1e-5", "--train-samples", "16", "--lr-warmup-samples", "8",
             "--lr-decay-samples", "4"]
    args = validate_args(parse_args(args_list=flags), world_size=1, cuda_available=False)
    (warmup, decay), _ = schedule_lengths(args)
    assert (warmup, decay, args.lr_decay_style) == (8, 4, "linear")
    lr, _ = schedule(max_lr=args.lr, min_lr=args.min_lr, warmup_samples=warmup, decay_samples=decay)
    assert lr.step(4) == 5e-4       # 1e-3 x 4 / 8, mid-warm-up at the decay's end
    assert lr.step(4) == 1e-3       # the warm-up's end
    assert lr.step(4) == 1e-5       # past both


def test_the_warmups_last_value_is_the_warmup_formulas_to_the_last_bit():
    """At n = warmup the LR is the warm-up's max_lr x n / warmup, evaluated left to right in
    doubles as Megatron-LM does: 3e-3 x 3 rounds up to 0.009000000000000001, / 3 gives
    0.0030000000000000005 (the decay's formula at ratio 0 would give 0.003)."""
    lr, _ = schedule(max_lr=3e-3, warmup_samples=3, decay_samples=10)
    assert lr.step(3) == 0.0030000000000000005


def test_state_dict_keys_in_token_mode():
    lr, _ = schedule(warmup_samples=2, decay_samples=8, tokens_per_sample=16, decay_tokens=100)
    lr.step(3)
    assert lr.state_dict() == {"num_steps": 3, "max_lr": 1.0, "min_lr": 0.0, "warmup_steps": 2, "decay_steps": 8,
                               "decay_style": "linear", "num_tokens": 48, "warmup_tokens": None,
                               "decay_tokens": 100, "start_wd": None, "end_wd": None, "wd_incr_steps": None,
                               "wd_incr_style": "constant"}  # no weight-decay increment given
    lr, _ = schedule(warmup_samples=2, decay_samples=8)  # sample mode: no token position
    lr.step(3)
    assert lr.state_dict()["num_tokens"] is None and lr.state_dict()["num_steps"] == 3


def test_resume_refusal_names_each_difference_in_one_line():
    saved, _ = schedule(max_lr=2.0, decay_samples=20)
    lr, _ = schedule()
    with pytest.raises(ConfigError) as e:
        lr.load_state_dict(saved.state_dict())
    assert str(e.value) == (
        "--load: the checkpoint's learning-rate schedule differs from the flags' (learning rate: saved 2.0 vs "
        "now 1.0, decay samples: saved 20 vs now 10); pass --override-opt_param-scheduler to use the flags' or "
        "--use-checkpoint-opt_param-scheduler to keep the checkpoint's")


def flags(**kw):
    base = {"global_batch_size": 8, "train_iters": None, "lr_decay_iters": None, "lr_warmup_iters": 0,
            "lr_decay_samples": None, "train_samples": None, "lr_warmup_samples": 0, "lr_warmup_fraction": None}
    return SimpleNamespace(**{**base, **kw})


def test_schedule_lengths_from_each_spelling():
    # iterations x the global batch; the decay defaults to the run's length
    assert schedule_lengths(flags(train_iters=100, lr_warmup_iters=5)) == ((40, 800), (None, None))
    assert schedule_lengths(flags(train_iters=100, lr_decay_iters=50, lr_warmup_iters=5)) == ((40, 400), (None, None))
    # samples as given; --lr-warmup-fraction of the decay wins over a warmup length
    assert schedule_lengths(flags(train_samples=1000, lr_warmup_samples=30)) == ((30, 1000), (None, None))
    assert schedule_lengths(flags(train_samples=1000, lr_decay_samples=600, lr_warmup_fraction=0.25,
                                  lr_warmup_samples=30)) == ((150, 600), (None, None))
    assert schedule_lengths(flags(train_samples=1000, lr_warmup_tokens=64, lr_decay_tokens=6400)) == \
        ((0, 1000), (64, 6400))


def test_curriculum_tokens_in_token_mode_and_their_resume():
    """A curriculum trains shorter sequences: the trainer passes the tokens it trained, which the
    token position follows instead of samples x --seq-length; a resume restores that position, and a
    checkpoint from sample mode (no token position) resumes at samples x tokens per sample."""
    lr, _ = schedule(decay_samples=8, tokens_per_sample=16, decay_tokens=100)
    lr.step(2, tokens=2 * 4)        # 2 samples cut to 4 tokens: 8 tokens, not 32
    assert lr.num_tokens == 8 and lr.get_lr() == 1.0 - 8 / 100
    lr.step(1)                      # tokens not given: a full sample, 16
    assert lr.num_tokens == 24
    resumed, _ = schedule(decay_samples=8, tokens_per_sample=16, decay_tokens=100)
    resumed.load_state_dict(lr.state_dict())
    assert (resumed.num_samples, resumed.num_tokens) == (3, 24) and resumed.get_lr() == 1.0 - 24 / 100
    from_samples, _ = schedule(decay_samples=8)
    from_samples.step(3)
    resumed, _ = schedule(decay_samples=8, tokens_per_sample=16, decay_tokens=100)
    resumed.load_state_dict({**from_samples.state_dict(), "decay_tokens": 100})  # the flags' token decay
    assert resumed.num_tokens == 3 * 16 and resumed.get_lr() == 1.0 - 48 / 100


def test_wsd_lengths_of_args_without_the_wsd_flags():
    # an args namespace built before the WSD flags existed: no cool-down, (None, None)
    from megatron.schedules.learning_rates import wsd_decay_lengths
    assert wsd_decay_lengths(SimpleNamespace(train_iters=10, global_batch_size=8)) == (None, None)
    assert wsd_decay_lengths(SimpleNamespace(train_iters=None, global_batch_size=8)) == (None, None)
    # with them: 3 iterations x 8 = 24 samples; --train-samples: the samples as given
    assert wsd_decay_lengths(SimpleNamespace(train_iters=10, global_batch_size=8, lr_wsd_decay_iters=3,
                                             lr_wsd_decay_tokens=96)) == (24, 96)
    assert wsd_decay_lengths(SimpleNamespace(train_iters=None, global_batch_size=8,
                                             lr_wsd_decay_samples=40)) == (40, None)
