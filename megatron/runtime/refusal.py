"""How a refused run ends: its one-line error printed once per job, every rank exiting with code 2.

Every rank validates the same flags and files, so every rank raises the same ConfigError; printed
by each, a job of N ranks shows N identical lines (and argparse's usage, N times). Global rank 0
prints; it knows it is rank 0 from torch.distributed when that exists, else from the RANK the
launcher set (deepspeed, torchrun and the tests' launcher all set it before the script starts).

The other ranks must not leave first: DeepSpeed's launcher (and torchrun) stops every rank as soon
as one fails, so a rank 1 that exits before rank 0 has printed would have rank 0 killed with its
line unwritten. So they wait, silently, to be stopped, and a SIGTERM then ends them with the same
exit code 2. An error only some ranks hit (a file missing on one node) reaches no rank 0: after the
wait such a rank prints the line itself and exits 2, so no refusal is ever lost.
"""
import os
import signal
import sys
import time
from typing import NoReturn


class ConfigError(ValueError):
    """A bad flag combination. Its message is one line naming the flag and the fix."""


def require(cond: object, message: str) -> None:
    if not cond:
        raise ConfigError(message)


# the value rules of single flags, one wording for the trainer, tools/param_count.py and the shape
def require_positive(flag: str, value: float | None) -> None:
    """Sizes, counts and intervals: None (not given) or > 0."""
    require(value is None or value > 0, f"{flag} {value} must be positive")


def require_non_negative(flag: str, value: float | None) -> None:
    require(value is None or value >= 0, f"{flag} {value} must be >= 0")


def require_fraction(flag: str, value: float | None, below_one: bool = False) -> None:
    """A probability or fraction: in [0, 1] (or [0, 1) where 1 breaks the math, as for Adam's betas)."""
    ok = value is None or (0 <= value < 1 if below_one else 0 <= value <= 1)
    require(ok, f"{flag} {value} must be in [0, {'1)' if below_one else '1]'}")


EXIT_CODE = 2  # argparse's, for every refusal
WAIT_FOR_RANK_0_S = 30.0  # rank 0 runs the same checks; a launcher stops the job within this


def global_rank() -> int:
    """torch.distributed's rank once it exists; before it, the launcher's RANK (0 without one)."""
    if "torch" in sys.modules:  # a refusal before torch was imported has no process group to ask
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def exit_refused(program: str, message: str, wait_s: float = WAIT_FOR_RANK_0_S) -> NoReturn:
    """`program: error: message` on stderr from global rank 0 alone, then exit 2 on every rank."""
    line = f"{program}: error: {message}\n"
    if global_rank() != 0:
        sys.stdout.flush()
        # the launcher's SIGTERM once rank 0 has failed: the same exit code, and nothing printed
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(EXIT_CODE))
        time.sleep(wait_s)
    # written in one piece, so that another process's output cannot land inside the line
    sys.stderr.write(line)
    sys.stderr.flush()
    sys.exit(EXIT_CODE)
