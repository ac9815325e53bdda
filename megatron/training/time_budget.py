"""--exit-duration-in-mins as a budget for the whole allocation: counted from the start of the
earliest rank's process (Megatron-LM counts from its trainer's import, agreed by a MIN all-reduce
over the ranks), so the time spent importing, building the model and loading a checkpoint is in
it. The run stops once what is left would not hold one more iteration and the save that follows:

    used + longest iteration + save > budget   ->   save and exit now

`used`: seconds since that start; `longest iteration`: the longest iteration of this run so far
(training step, logging, evaluation; not the save), 0 before the first; `save`: the last save's
duration, or, before any save, an estimate on the slow side (FIRST_SAVE_S plus the predicted
checkpoint bytes at FIRST_SAVE_BYTES_PER_S). The ranks agree on the three numbers (a MAX
all-reduce, trainer.py's stop_flags), so every rank stops after the same iteration."""
import time
from dataclasses import dataclass

import torch

from megatron.runtime.process_identity import process_start_time

FIRST_SAVE_S = 1.0                 # before a save was measured: its fixed costs (barriers, renames, manifest) ...
FIRST_SAVE_BYTES_PER_S = 100e6     # ... and its bytes at a slow network disk's rate


def first_save_estimate(checkpoint_bytes: int) -> float:
    return FIRST_SAVE_S + checkpoint_bytes / FIRST_SAVE_BYTES_PER_S


def earliest_process_start() -> float:
    """The earliest start of any rank's process (time.time() seconds), the same on every rank."""
    start = torch.tensor([process_start_time()], dtype=torch.float64)  # float32 would round it by minutes
    if torch.cuda.is_available():
        start = start.cuda()
    torch.distributed.all_reduce(start, op=torch.distributed.ReduceOp.MIN)
    return float(start.item())


@dataclass
class TimeBudget:
    """This rank's view of the budget: the measured times that decide when it is spent."""
    seconds: float | None            # --exit-duration-in-mins x 60 (None: no budget)
    start: float                     # earliest_process_start()
    save_estimate: float             # first_save_estimate(...) (0 without --save: nothing to write)
    longest_iteration: float = 0.0
    last_save: float | None = None

    def iteration_took(self, seconds: float) -> None:
        self.longest_iteration = max(self.longest_iteration, seconds)

    def save_took(self, seconds: float) -> None:
        self.last_save = seconds

    def times(self, now: float | None = None) -> tuple[float, float, float]:
        """(used, longest iteration, save) as this rank sees them now."""
        used = (time.time() if now is None else now) - self.start
        return used, self.longest_iteration, self.save_estimate if self.last_save is None else self.last_save


def out_of_time(seconds: float, used: float, iteration: float, save: float) -> bool:
    """The decision (module docstring), on the ranks' agreed times."""
    return used + iteration + save > seconds


def stop_line(seconds: float, used: float, iteration: float, save: float, saved_before: bool,
              iteration_number: int) -> str:
    save_kind = "the last save" if saved_before else "the first save, estimated"
    return (f"--exit-duration-in-mins: {used:.3f} s used of {seconds:.3f} s; one more iteration ({iteration:.3f} s, "
            f"the longest so far) and a save ({save:.3f} s, {save_kind}) would not fit: stopping after iteration "
            f"{iteration_number}")
