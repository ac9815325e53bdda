"""Learning-rate schedule: linear warmup, then constant / linear / cosine / WSD decay to min-lr,
measured in samples (iteration-based flags are converted to samples with the global batch), or in
tokens when --lr-warmup-tokens or --lr-decay-tokens is given (Microsoft's Megatron-DeepSpeed:
token lengths override the iteration/sample ones; tokens: those trained, samples x --seq-length,
or x a curriculum's shorter length while it warms up, as the fork counts consumed tokens).

WSD (Megatron-LM's --lr-decay-style WSD): warm-up, then max-lr (stable) until the last
--lr-wsd-decay-iters/-samples (or, here, -tokens) of the decay length, then a cool-down to min-lr of
shape --lr-wsd-decay-style; min-lr after the decay length, as the other styles."""
import math
from argparse import Namespace
from typing import Any

from megatron.runtime.refusal import ConfigError

# what a checkpoint's schedule must agree on with the flags (the fork's _check_and_set list)
CHECKED = (("max_lr", "learning rate"), ("min_lr", "minimum learning rate"),
           ("warmup_samples", "warmup samples"), ("decay_samples", "decay samples"),
           ("warmup_tokens", "warmup tokens"), ("decay_tokens", "decay tokens"),
           ("decay_style", "decay style"), ("wsd_decay_samples", "WSD decay samples"),
           ("wsd_decay_tokens", "WSD decay tokens"), ("wsd_decay_style", "WSD decay style"),
           # the weight-decay increment (Megatron checks these only where a checkpoint has them)
           ("start_wd", "start weight decay"), ("end_wd", "end weight decay"),
           ("wd_incr_samples", "weight decay increment samples"), ("wd_incr_style", "weight decay increment style"))
# Megatron-LM's lr_wsd_decay_style: the cool-down's coefficient at the fraction r of it done (1 -> 0)
WSD_DECAY_STYLES = {
    "exponential": lambda r: 2.0 * math.pow(0.5, r) - 1.0,
    "linear": lambda r: 1.0 - r,
    "cosine": lambda r: 0.5 * (math.cos(math.pi * r) + 1.0),
    "minus_sqrt": lambda r: 1.0 - math.sqrt(r),
}
_SAVED_KEYS = {"warmup_samples": "warmup_steps", "decay_samples": "decay_steps", "decay_style": "decay_style",
               "wsd_decay_samples": "wsd_decay_steps", "wsd_decay_style": "lr_wsd_decay_style",
               "wd_incr_samples": "wd_incr_steps"}
_WD_KEYS = ("start_wd", "end_wd", "wd_incr_steps", "wd_incr_style")


def weight_decay_at(samples: int, start_wd: float, end_wd: float, incr_samples: int, style: str) -> float:
    """Megatron's OptimizerParamScheduler.get_wd: from start_wd to end_wd over incr_samples (the
    whole run), linearly or along a half cosine; end_wd after it; constant: end_wd (= start_wd)."""
    if samples > incr_samples or style == "constant":
        return end_wd
    ratio = samples / incr_samples
    coeff = ratio if style == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
    return start_wd + coeff * (end_wd - start_wd)


def weight_decay_samples(args: Namespace) -> int:
    """Megatron's wd_incr_steps: the run's length in samples (--train-iters x the global batch, or
    --train-samples)."""
    if args.train_iters is not None:
        return args.train_iters * args.global_batch_size
    from megatron.schedules.microbatches import train_samples
    return args.train_samples if args.train_samples is not None else train_samples(args)


def schedule_lengths(args: Namespace) -> tuple[tuple[int, int], tuple[int | None, int | None]]:
    """(warmup, decay) of the schedule in samples, and (warmup, decay) in tokens or (None, None)."""
    gbs = args.global_batch_size
    if args.train_iters is not None:
        decay = (args.lr_decay_iters or args.train_iters) * gbs
        warmup = args.lr_warmup_iters * gbs
    else:
        decay = args.lr_decay_samples or args.train_samples
        warmup = args.lr_warmup_samples
    if args.lr_warmup_fraction is not None:
        warmup = int(args.lr_warmup_fraction * decay)
    return (warmup, decay), (getattr(args, "lr_warmup_tokens", None), getattr(args, "lr_decay_tokens", None))


def wsd_decay_lengths(args: Namespace) -> tuple[int | None, int | None]:
    """WSD's cool-down length in samples (Megatron-LM: --lr-wsd-decay-iters x the global batch with
    --train-iters, --lr-wsd-decay-samples with --train-samples) and in tokens (--lr-wsd-decay-tokens)."""
    iters = getattr(args, "lr_wsd_decay_iters", None)
    if args.train_iters is not None:
        samples = None if iters is None else iters * args.global_batch_size
    else:
        samples = getattr(args, "lr_wsd_decay_samples", None)
    return samples, getattr(args, "lr_wsd_decay_tokens", None)


class AnnealingLR:
    # optimizer: anything with torch's `param_groups` (a torch optimizer or DeepSpeed's wrapper of one)
    def __init__(self, optimizer: Any, max_lr: float, min_lr: float, warmup_samples: int, decay_samples: int,
                 decay_style: str, tokens_per_sample: int | None = None, warmup_tokens: int | None = None,
                 decay_tokens: int | None = None, use_checkpoint_scheduler: bool = False,
                 override_scheduler: bool = False, wsd_decay_samples: int | None = None,
                 wsd_decay_tokens: int | None = None, wsd_decay_style: str = "exponential",
                 start_wd: float | None = None, end_wd: float | None = None,
                 wd_incr_samples: int | None = None, wd_incr_style: str = "constant") -> None:
        self.optimizer = optimizer
        self.max_lr, self.min_lr = max_lr, min_lr
        self.warmup_samples, self.decay_samples = warmup_samples, decay_samples
        self.decay_style = decay_style
        # token mode: a length given in tokens is used as is, the other one converted from samples
        self.tokens_per_sample = tokens_per_sample
        self.warmup_tokens, self.decay_tokens = warmup_tokens, decay_tokens
        self.use_checkpoint_scheduler, self.override_scheduler = use_checkpoint_scheduler, override_scheduler
        # WSD's cool-down: its length (samples, and tokens in token mode) and shape; None unless WSD
        wsd = decay_style == "WSD"
        self.wsd_decay_samples = wsd_decay_samples if wsd else None
        self.wsd_decay_tokens = wsd_decay_tokens if wsd else None
        self.wsd_decay_style = wsd_decay_style if wsd else None
        self.num_samples = 0  # consumed by the updates applied so far
        self.num_tokens = 0   # the same in tokens (token mode)
        # the weight-decay increment (None: the param groups' weight decay is left as built); it
        # moves the groups marked with a `wd_mult` (megatron/training/optimizer.py), as Megatron does
        self.start_wd, self.end_wd = start_wd, end_wd
        self.wd_incr_samples, self.wd_incr_style = wd_incr_samples, wd_incr_style
        self.step(0)

    @property
    def token_based(self) -> bool:
        return self.warmup_tokens is not None or self.decay_tokens is not None or self.wsd_decay_tokens is not None

    def _wsd_length(self) -> int:
        """The cool-down's length in the schedule's unit."""
        if self.token_based and self.wsd_decay_tokens is not None:
            return self.wsd_decay_tokens
        assert self.wsd_decay_samples is not None  # validation requires one of the lengths
        return self.wsd_decay_samples * (self.tokens_per_sample or 1) if self.token_based else self.wsd_decay_samples

    def _lengths(self) -> tuple[int, int, int]:
        """(consumed, warmup, decay) in the schedule's unit: samples, or tokens in token mode."""
        if not self.token_based:
            return self.num_samples, self.warmup_samples, self.decay_samples
        t = self.tokens_per_sample
        warmup = self.warmup_tokens if self.warmup_tokens is not None else self.warmup_samples * t
        decay = self.decay_tokens if self.decay_tokens is not None else self.decay_samples * t
        return self.num_tokens, warmup, decay

    def get_lr(self) -> float:
        n, warmup, decay = self._lengths()
        if warmup > 0 and n <= warmup:
            return self.max_lr * n / warmup
        if self.decay_style == "constant":
            return self.max_lr
        if n > decay:
            return self.min_lr
        if self.decay_style == "WSD":
            return self.min_lr + self._wsd_coeff(n, decay) * (self.max_lr - self.min_lr)
        ratio = (n - warmup) / max(1, decay - warmup)
        if self.decay_style == "linear":
            coeff = 1.0 - ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def _wsd_coeff(self, n: int, decay: int) -> float:
        """1 in the stable phase; then the cool-down's shape over its last `_wsd_length()` units."""
        length = self._wsd_length()
        start = decay - length
        if n <= start:
            return 1.0
        assert self.wsd_decay_style is not None
        return WSD_DECAY_STYLES[self.wsd_decay_style]((n - start) / length)

    def step(self, samples: int, tokens: int | None = None) -> float:
        """Advance by `samples` (the global batch of the iteration just applied) holding `tokens`
        tokens (default samples x tokens_per_sample)."""
        self.num_samples += samples
        if self.token_based:
            self.num_tokens += samples * self.tokens_per_sample if tokens is None else tokens
        lr = self.get_lr()
        wd = self.get_wd()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            if wd is not None and "wd_mult" in group:
                group["weight_decay"] = wd * group["wd_mult"]
        return lr

    def get_wd(self) -> float | None:
        """Weight decay after the samples consumed so far (None without an increment schedule)."""
        if self.start_wd is None or self.end_wd is None or self.wd_incr_samples is None:
            return None
        return weight_decay_at(self.num_samples, self.start_wd, self.end_wd, self.wd_incr_samples,
                               self.wd_incr_style)

    def state_dict(self) -> dict[str, Any]:
        # key names as Megatron saves them (num_steps, warmup_steps, decay_steps), which count samples
        # here; the token ones as BigScience's fork names them; WSD's only with WSD (Megatron-LM saves
        # none of them: a resume would not see a changed cool-down)
        wsd = {"wsd_decay_steps": self.wsd_decay_samples, "wsd_decay_tokens": self.wsd_decay_tokens,
               "lr_wsd_decay_style": self.wsd_decay_style} if self.decay_style == "WSD" else {}
        return wsd | {"num_steps": self.num_samples, "max_lr": self.max_lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_samples, "decay_steps": self.decay_samples,
                "decay_style": self.decay_style, "num_tokens": self._lengths()[0] if self.token_based else None,
                "warmup_tokens": self.warmup_tokens, "decay_tokens": self.decay_tokens,
                "start_wd": self.start_wd, "end_wd": self.end_wd, "wd_incr_steps": self.wd_incr_samples,
                "wd_incr_style": self.wd_incr_style}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The position always comes from the checkpoint. The schedule's settings must equal the
        flags', unless --override-opt_param-scheduler (the flags win) or
        --use-checkpoint-opt_param-scheduler (the checkpoint wins), as in both forks."""
        differ = []
        for attr, name in CHECKED:
            key = _SAVED_KEYS.get(attr, attr)
            saved, ours = state.get(key), getattr(self, attr)
            if saved == ours or (key in _WD_KEYS and key not in state):  # saved before the increment existed
                continue
            if key == "wd_incr_steps" and self.wd_incr_style == state.get("wd_incr_style") == "constant":
                continue  # the run's length moves no constant weight decay (a longer --train-iters resumes)
            if self.use_checkpoint_scheduler:
                setattr(self, attr, saved)
            elif not self.override_scheduler:
                differ.append(f"{name}: saved {saved} vs now {ours}")
        if differ:
            raise ConfigError("--load: the checkpoint's learning-rate schedule differs from the flags' ("
                              + ", ".join(differ) + "); pass --override-opt_param-scheduler to use the flags' "
                              "or --use-checkpoint-opt_param-scheduler to keep the checkpoint's")
        self.num_samples = state["num_steps"]
        if self.token_based:  # a checkpoint saved in sample mode has no token position: derived
            saved = state.get("num_tokens")
            self.num_tokens = saved if saved is not None else self.num_samples * self.tokens_per_sample
        self.step(0)
