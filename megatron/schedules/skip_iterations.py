"""--skip-train-iteration-range START-END ... (BigScience's Megatron-DeepSpeed, used to step over
the data behind a loss spike): iterations START..END (1-based, inclusive) train nothing. Their
batches are read from the data iterator and dropped, and the iteration number and consumed samples
advance as if they had trained, so the data and the iteration numbers after a skipped range are
those of the unskipped run; no forward, backward or optimizer step runs and the LR schedule does
not advance (as for an fp16 step skipped on overflow). Saves and exit checks run after a skipped
iteration as after a trained one (megatron/training/trainer.py). BigScience's loop leaves the iteration
number where it was and drops a count of batches that depends on where the run resumed; the
meaning above is the one its help text gives, and Megatron-LM's --iterations-to-skip."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from megatron.runtime.refusal import require

if TYPE_CHECKING:  # annotations only
    from megatron.schedules.microbatches import NumMicroBatchesCalculator
    from megatron.schedules.progress import TrainingProgress


def parse_ranges(values: Iterable[str]) -> list[tuple[int, int]]:
    """['101-200', '251-300'] -> [(101, 200), (251, 300)]: checked, sorted, overlaps merged."""
    ranges = []
    for text in values:
        parts = text.split("-")
        require(len(parts) == 2 and all(p.strip().isdigit() for p in parts),
                f"--skip-train-iteration-range {text}: give START-END, e.g. 101-200")
        start, end = int(parts[0]), int(parts[1])
        require(1 <= start <= end, f"--skip-train-iteration-range {text}: needs 1 <= START <= END")
        ranges.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def skipped_range(ranges: Sequence[tuple[int, int]] | None, iteration: int) -> tuple[int, int] | None:
    """The range holding `iteration`, or None."""
    return next(((s, e) for s, e in ranges or () if s <= iteration <= e), None)


def skip_iteration(calculator: NumMicroBatchesCalculator, train_iter: Iterator[Any] | None,
                   progress: TrainingProgress, seq_length: int) -> None:
    """Read and drop one iteration's micro-batches (ranks that read data); count it as consumed."""
    gbs = calculator.get_current_global_batch_size()
    if train_iter is not None:
        for _ in range(calculator.get()):
            next(train_iter)
    progress.iteration += 1
    progress.consumed_train_samples += gbs
    progress.consumed_train_tokens += gbs * seq_length
    calculator.update(progress.consumed_train_samples)
