"""Flags that the forks' published launch scripts pass and that change neither the model nor the
training here: each is accepted so the script runs unchanged, and the ones a user actually passed
are named in one startup line on rank 0 (flag_table.py's no-effect rows say why each has no effect;
docs/flags.md renders them). A flag that changes what is trained or what a user reads is never listed here."""
from argparse import ArgumentParser, Namespace
from collections.abc import Iterable

from megatron.config import flag_table

# flag -> why it has no effect in this trainer (megatron/config/flag_table.py; docs/flags.md renders it)
NO_EFFECT = {flag: row.why for flag, row in flag_table.by_status(flag_table.NO_EFFECT).items()}
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
