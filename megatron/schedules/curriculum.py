"""Sequence-length curriculum learning as both Megatron-DeepSpeed forks run it (issue 31): the
ds_config's legacy top-level `curriculum_learning` block, which DeepSpeed 0.19 no longer accepts,
is taken out of the ds_config during validation (megatron/config/arguments.py) and run here.

Iteration i (1-based: the fork asks the schedule for the global step about to run) trains on
the first `seqlen(i)` tokens of each training sample (tokens, labels and loss mask cut alike);
evaluation stays at --seq-length, as in both forks. The schedule is a pure function of the
iteration, so a resumed run continues it exactly. The schedules are DeepSpeed's legacy ones
(deepspeed/runtime/data_pipeline/curriculum_scheduler.py):
- fixed_linear / fixed_root: min + (max - min) x (step / total_curriculum_step)^(1/root_degree),
  floored, rounded down to a multiple of difficulty_step (but not below the first multiple at or
  above min_difficulty), capped at max_difficulty;
- fixed_discrete: difficulty[k] for the steps up to max_step[k], the last difficulty after.
Once the schedule reached max_difficulty it stays there (DeepSpeed's scheduler stops updating)."""
import math
from dataclasses import dataclass
from typing import Any

from megatron.runtime.refusal import ConfigError

SCHEDULE_TYPES = ("fixed_linear", "fixed_root", "fixed_discrete")
_BLOCK_KEYS = {"enabled", "curriculum_type", "min_difficulty", "max_difficulty", "schedule_type", "schedule_config"}
_SCHEDULE_KEYS = {"fixed_linear": {"total_curriculum_step", "difficulty_step"},
                  "fixed_root": {"total_curriculum_step", "difficulty_step", "root_degree"},
                  "fixed_discrete": {"difficulty", "max_step"}}


@dataclass(frozen=True)
class CurriculumSchedule:
    """An enabled seqlen curriculum (the ds_config's `curriculum_learning`), validated."""
    min_difficulty: int
    max_difficulty: int
    schedule_type: str  # one of SCHEDULE_TYPES
    total_curriculum_step: int = 0  # fixed_linear / fixed_root
    difficulty_step: int = 1
    root_degree: float = 1.0        # fixed_root (fixed_linear: 1)
    difficulty: tuple[int, ...] = ()  # fixed_discrete
    max_step: tuple[int, ...] = ()

    def _raw(self, step: int) -> int:
        """DeepSpeed's get_difficulty(step), before the hold at max_difficulty."""
        if self.schedule_type == "fixed_discrete":
            for difficulty, last_step in zip(self.difficulty, self.max_step, strict=False):
                if step <= last_step:
                    return difficulty
            return self.difficulty[-1]
        low, high, unit = self.min_difficulty, self.max_difficulty, self.difficulty_step
        value = math.floor((step / self.total_curriculum_step) ** (1.0 / self.root_degree) * (high - low) + low)
        value -= value % unit
        value = max(value, -(-low // unit) * unit)  # never below min (a zero-length sequence at the start)
        return min(value, high)

    def seqlen(self, step: int) -> int:
        """The sequence length trained at iteration `step` (1-based) of an uninterrupted run."""
        if self.min_difficulty >= self.max_difficulty:
            return self.min_difficulty  # DeepSpeed's scheduler never leaves its start
        # the value held once the schedule first reached max_difficulty: the schedule changes only
        # at step 1 and right after a fixed_discrete max_step; fixed_linear / fixed_root only grow
        changes = [1] + [s + 1 for s in self.max_step] if self.schedule_type == "fixed_discrete" else [1]
        for first in sorted(c for c in changes if c <= step):
            if self._raw(first) >= self.max_difficulty:
                return self._raw(first)
        return self._raw(step)

    def steady_from(self) -> int:
        """The first iteration from which the length never changes: the schedule holds once it
        reached max_difficulty, and a fixed_discrete one keeps its last difficulty after its last
        max_step (fixed_linear / fixed_root always reach max_difficulty: they grow without bound
        before the cap)."""
        last = max(self.max_step) + 1 if self.schedule_type == "fixed_discrete" else math.inf
        step = 1
        while step < last and self.seqlen(step) < self.max_difficulty:
            step += 1
        return step

    def describe(self, seq_length: int) -> str:
        """The startup line."""
        if self.schedule_type == "fixed_discrete":
            how = "; ".join(f"{d} to step {s}" for d, s in zip(self.difficulty, self.max_step, strict=False))
            how = f"fixed_discrete: {how}; {self.difficulty[-1]} after"
        else:
            root = f", root degree {self.root_degree:g}" if self.schedule_type == "fixed_root" else ""
            how = (f"{self.schedule_type}: {self.min_difficulty} -> {self.max_difficulty} tokens over "
                   f"{self.total_curriculum_step} iterations in steps of {self.difficulty_step}{root}")
        return (f"sequence-length curriculum (ds_config curriculum_learning), {how}; training samples cut to it, "
                f"evaluation at --seq-length {seq_length}")

    def seqlens(self) -> tuple[int, ...]:
        """Every length the schedule can train at (the FLOPs cache is built for these once)."""
        if self.min_difficulty >= self.max_difficulty:
            return (self.min_difficulty,)
        if self.schedule_type == "fixed_discrete":
            return tuple(sorted(set(self.difficulty)))
        unit, low, high = self.difficulty_step, self.min_difficulty, self.max_difficulty
        first = -(-low // unit) * unit
        return tuple(sorted({min(max(v, first), high) for v in range(0, high + unit, unit)}))


def parse_curriculum(block: Any, where: str, seq_length: int) -> CurriculumSchedule | None:
    """The ds_config's `curriculum_learning` block: None when it is not enabled (both forks read
    `enabled`, absent meaning off); a CurriculumSchedule when it is; ConfigError (one line naming
    the key and the fix) for what this trainer cannot run as the forks did."""
    name = f"{where}: curriculum_learning"

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(f"{name}{message}")

    need(isinstance(block, dict), " must be an object")
    if not block.get("enabled", False):
        return None
    unknown = sorted(set(block) - _BLOCK_KEYS)
    need(not unknown, f": unknown key(s) {', '.join(unknown)}; the legacy block has {', '.join(sorted(_BLOCK_KEYS))}")
    need(block.get("curriculum_type") == "seqlen",
         f'.curriculum_type {block.get("curriculum_type")!r}: only "seqlen" (sequence-length warm-up) is supported')
    schedule_type = block.get("schedule_type")
    need(schedule_type in SCHEDULE_TYPES,
         f".schedule_type {schedule_type!r}: use {', '.join(SCHEDULE_TYPES)}")
    low, high = block.get("min_difficulty"), block.get("max_difficulty")
    for key, value in (("min_difficulty", low), ("max_difficulty", high)):
        need(_positive_int(value), f".{key} {value!r}: give a positive integer (a sequence length)")
    need(low <= high, f": min_difficulty {low} exceeds max_difficulty {high}")
    need(high <= seq_length, f".max_difficulty {high} exceeds --seq-length {seq_length}: the curriculum cuts "
                             f"samples of --seq-length tokens; lower it or raise --seq-length")
    config = block.get("schedule_config")
    need(isinstance(config, dict), f'.schedule_config is missing: {schedule_type} needs '
                                   f'{", ".join(sorted(_SCHEDULE_KEYS[schedule_type]))}')
    keys = _SCHEDULE_KEYS[schedule_type]
    need(set(config) == keys, f".schedule_config has {', '.join(sorted(config)) or 'no keys'}: {schedule_type} "
                              f"takes exactly {', '.join(sorted(keys))}")
    if schedule_type == "fixed_discrete":
        difficulty, max_step = config["difficulty"], config["max_step"]
        need(isinstance(difficulty, list) and len(difficulty) >= 2 and all(_positive_int(d) for d in difficulty),
             f".schedule_config.difficulty {difficulty!r}: give a list of at least two positive sequence lengths")
        need(all(d <= seq_length for d in difficulty),
             f".schedule_config.difficulty {difficulty!r}: a length exceeds --seq-length {seq_length}")
        need(isinstance(max_step, list) and len(max_step) == len(difficulty) - 1
             and all(_positive_int(s) for s in max_step),
             f".schedule_config.max_step {max_step!r}: give {len(difficulty) - 1} positive steps, one fewer than "
             f"the difficulties (the last difficulty holds after the last step)")
        return CurriculumSchedule(low, high, schedule_type, difficulty=tuple(difficulty), max_step=tuple(max_step))
    total, unit = config["total_curriculum_step"], config["difficulty_step"]
    need(_positive_int(total), f".schedule_config.total_curriculum_step {total!r}: give a positive integer")
    need(_positive_int(unit), f".schedule_config.difficulty_step {unit!r}: give a positive integer")
    degree = config.get("root_degree", 1)
    need(isinstance(degree, (int, float)) and not isinstance(degree, bool) and degree > 0,
         f".schedule_config.root_degree {degree!r}: give a positive number (2: square root)")
    return CurriculumSchedule(low, high, schedule_type, total, unit, float(degree))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def truncate_sample_batch(data: dict, seqlen: int) -> dict:
    """A training batch as the loader yields it ({"text": [b, s+1]}) cut to `seqlen` tokens: the
    input tokens, the labels (shifted by one) and the loss mask all end at `seqlen`, as the forks
    cut tokens, labels, loss mask and position ids to [:, :seqlen]."""
    text = data["text"]
    if text.size(1) <= seqlen + 1:
        return data
    return {**data, "text": text[:, :seqlen + 1].contiguous()}
