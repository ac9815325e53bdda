"""pretrain_gpt.py with each pipeline stage's time split into busy and waiting (a benchmark
wrapper; bench_layouts.py launches it in place of pretrain_gpt.py).

DeepSpeed's PipelineEngine runs one instruction at a time; their wall times sum to the iteration.
busy: load, forward (with the loss), backward, optimizer step. waiting: the blocking p2p send /
receive of activations and gradients and the all-reduces between stages (tied embedding, DP
gradients), which on CPU mostly wait for the peer stage. After every iteration each rank prints
its cumulative totals: STAGE_TIME stage=S tp=T iteration=I busy=X waiting=Y (seconds)."""
import collections
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from deepspeed.runtime.pipe import schedule  # noqa: E402
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402

import pretrain_gpt  # noqa: E402

WAITING = (schedule.SendActivation, schedule.RecvActivation, schedule.SendGrad, schedule.RecvGrad,
           schedule.ReduceTiedGrads, schedule.ReduceGrads)
totals: collections.defaultdict[str, float] = collections.defaultdict(float)


def _timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[kind] += time.perf_counter() - start
    return run


for instruction, fn in list(PipelineEngine._INSTRUCTION_MAP.items()):
    PipelineEngine._INSTRUCTION_MAP[instruction] = _timed("waiting" if instruction in WAITING else "busy", fn)
_train_batch = PipelineEngine.train_batch


def train_batch(self: PipelineEngine, *args: Any, **kwargs: Any) -> torch.Tensor:
    loss = _train_batch(self, *args, **kwargs)
    totals["iteration"] += 1
    print(f"STAGE_TIME stage={self.stage_id} tp={self.grid.get_slice_parallel_rank()} "
          f"iteration={int(totals['iteration'])} busy={totals['busy']:.6f} waiting={totals['waiting']:.6f}",
          flush=True)
    return loss


PipelineEngine.train_batch = train_batch

if __name__ == "__main__":
    pretrain_gpt.main()
