"""Learning-rate schedule: linear warmup, then constant / linear / cosine decay to min-lr,
measured in samples (iteration-based flags are converted to samples with the global batch)."""
import math


class AnnealingLR:
    def __init__(self, optimizer, max_lr, min_lr, warmup_samples, decay_samples, decay_style):
        self.optimizer = optimizer
        self.max_lr, self.min_lr = max_lr, min_lr
        self.warmup_samples, self.decay_samples = warmup_samples, decay_samples
        self.decay_style = decay_style
        self.num_samples = 0  # consumed by the updates applied so far
        self.step(0)

    def get_lr(self):
        n = self.num_samples
        if self.warmup_samples > 0 and n <= self.warmup_samples:
            return self.max_lr * n / self.warmup_samples
        if self.decay_style == "constant":
            return self.max_lr
        if n > self.decay_samples:
            return self.min_lr
        ratio = (n - self.warmup_samples) / max(1, self.decay_samples - self.warmup_samples)
        if self.decay_style == "linear":
            coeff = 1.0 - ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def step(self, samples):
        """Advance by `samples` (the global batch of the iteration just applied)."""
        self.num_samples += samples
        lr = self.get_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def state_dict(self):
        # key names as Megatron saves them (num_steps, warmup_steps, decay_steps), which count samples here
        return {"num_steps": self.num_samples, "max_lr": self.max_lr, "min_lr": self.min_lr,
                "warmup_steps": self.warmup_samples, "decay_steps": self.decay_samples,
                "decay_style": self.decay_style}

    def load_state_dict(self, state):
        self.num_samples = state["num_steps"]
        self.step(0)
