"""Flags that the forks' published launch scripts pass and that change neither the model nor the
training here: each is accepted so the script runs unchanged, and the ones a user actually passed
are named in one startup line on rank 0 (docs/flags.md, "Flags accepted with no effect", says why each
has no effect). A flag that changes what is trained or what a user reads is never listed here."""
from argparse import ArgumentParser, Namespace
from collections.abc import Iterable

# flag -> why it has no effect in this trainer (docs/flags.md says the same in more words)
NO_EFFECT = {
    "--no-masked-softmax-fusion": "no fused kernels are used",
    "--no-bias-gelu-fusion": "no fused kernels are used",
    "--no-bias-dropout-fusion": "no fused kernels are used",
    "--no-gradient-accumulation-fusion": "no fused kernels are used",
    "--abort-on-unmet-fused-kernel-constraints": "no fused softmax kernel exists to abort for",
    "--DDP-impl": "DeepSpeed reduces the gradients",
    "--no-save-optim": "DeepSpeed's save_checkpoint always writes the optimizer state",
    "--tensorboard-log-interval": "TensorBoard is written every --log-interval",
    "--data-impl": "only the mmap format exists",
    "--codecarbon-dir": "the fork's own CodeCarbon tracker is a no-op",
    "--no-async-tensor-model-parallel-allreduce": "an overlap of communication and compute",
    "--use-flash-attn": "attention is exact either way",
    "--use-flash-attn-v2": "attention is exact either way",
    "--use-flash-attn-triton": "attention is exact either way",
    "--use-flash-attn-builder": "attention is exact either way",
    "--timing-log-level": "one timer, the iteration time, is reported at every level",
    "--no-load-lr-state": "Microsoft's fork defines it but never reads it: the LR state loads as without it",
    "--dataloader-type": "single (the forks' GPT default) is what runs; cyclic is refused",
    "--no-data-sharding": "it acts on the cyclic sampler only, which is refused",
    "--transformer-impl": "local is this trainer's transformer; transformer_engine is refused",
    "--recompute-activations": "= --recompute-granularity selective",
    "--recompute-granularity": "selective recomputes attention's core: the same math (full is implemented)",
}
# a flag of NO_EFFECT that has an effect with this value (its dest, the value)
EFFECTIVE_WHEN = {"--recompute-granularity": ("recompute_granularity", "full")}


def given_flags(parser: ArgumentParser, argv: Iterable[object]) -> list[str]:
    """The option strings in `argv` as the user spelled them (`--flag=value` included)."""
    known = parser._option_string_actions
    names = [str(tok).split("=", 1)[0] for tok in argv]
    return [name for name in names if name.startswith("--") and name in known]


def no_effect_line(args: Namespace) -> str | None:
    """'accepted, no effect: --a, --b' for the flags of NO_EFFECT the user passed, or None."""
    passed = [flag for flag in dict.fromkeys(getattr(args, "given_flags", ())) if flag in NO_EFFECT
              and not (flag in EFFECTIVE_WHEN and getattr(args, EFFECTIVE_WHEN[flag][0]) == EFFECTIVE_WHEN[flag][1])]
    if not passed:
        return None
    return "accepted, no effect: " + ", ".join(passed) + " (docs/flags.md, 'Flags accepted with no effect', says why)"
