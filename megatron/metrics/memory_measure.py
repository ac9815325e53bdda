"""What each rank really holds, measured once over the first iteration and printed by the last
rank next to the prediction of megatron/metrics/memory.py.

Bytes are storage sizes, each storage once (a parameter that is a view of a DeepSpeed flat
buffer counts the whole buffer, padding included):
  weights     storages of the model's parameters (ZeRO 3: their partitions, `ds_tensor`);
  gradients   at the entry of the optimizer's step() in the first iteration: the parameters'
              `.grad` and the gradient buffers the DeepSpeed optimizer holds (its attributes
              named *grad*), minus weight storages and 0-dim norms;
  optimizer   after the first iteration: the inner optimizer's parameters that are not weights
              (fp32 master copies / partitions; ZeRO 3's, which its param groups hold only during
              step(), from the ZeRO optimizer) and every tensor in its `state`;
  activations on CPU the peak of the bytes autograd saved for backward (saved_tensors_hooks,
              parameters excluded); on CUDA max_memory_allocated over the iteration minus the
              weights, gradients and optimizer state (so it includes transient buffers).
With fp16's dynamic loss scale the first steps usually overflow and are skipped: the optimizer
state does not exist yet after iteration 1 and the report shows a MISMATCH for it (use bf16, or
a static --loss-scale, to check it).
"""
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from megatron import mpu, print_rank_0, print_rank_last
from megatron.metrics.config import LoggingConfig
from megatron.metrics.memory import TrainingSetup, format_memory_report, predict_memory
from megatron.model.shape import ModelShape
from megatron.runtime.deepspeed_internals import (
    basic_optimizer,
    call_once_before_step,
    gradient_holders,
    zero3_master_partitions,
)

FIELDS = ("weights", "gradients", "optimizer", "activations")


def _storage(t):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _unique_bytes(tensors, exclude=()):
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.numel() > 0:
            ptr, size = _storage(t)
            if ptr not in exclude:
                seen[ptr] = size
    return sum(seen.values()), set(seen)


def _tensors_in(value, depth=0):
    """Tensors inside (nested) lists, tuples, dicts and small holder objects."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > 4 or value is None or isinstance(value, (str, bytes, int, float, bool)):
        return
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v, depth + 1)
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("deepspeed"):
        for v in vars(value).values():
            yield from _tensors_in(v, depth + 1)


def weight_tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    for p in model.parameters():
        yield p.ds_tensor if hasattr(p, "ds_tensor") else p  # type: ignore[attr-defined]  # ZeRO-3's partition
        if hasattr(p, "ds_tensor") and p.numel() > 0:
            yield p  # ZeRO 3: a persistent (small) parameter stays whole as well


class SavedTensorPeak:
    """Peak bytes of tensors saved for backward (unique storages, parameters excluded)."""

    def __init__(self, exclude):
        self.exclude, self.live, self.current, self.peak = exclude, {}, 0, 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor):
        if tensor.device.type == "meta" or tensor.numel() == 0:
            return tensor
        ptr, size = _storage(tensor)
        if ptr in self.exclude:
            return tensor
        count, _ = self.live.get(ptr, (0, size))
        if count == 0:
            self.current += size
            self.peak = max(self.peak, self.current)
        self.live[ptr] = (count + 1, size)
        return _Saved(tensor, ptr, self)

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def release(self, ptr: int) -> None:
        count, size = self.live[ptr]
        if count == 1:
            del self.live[ptr]
            self.current -= size
        else:
            self.live[ptr] = (count - 1, size)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class _Saved:
    """Holds a saved tensor; autograd drops it when backward no longer needs it."""
    __slots__ = ("tensor", "ptr", "owner")

    def __init__(self, tensor, ptr, owner):
        self.tensor, self.ptr, self.owner = tensor, ptr, owner

    def __del__(self):
        self.owner.release(self.ptr)


class MemoryProbe:
    """Armed at setup, read after the first iteration (see `start_memory_probe`); `setup` is what
    the prediction it is compared with was made for."""

    def __init__(self, engine, setup: TrainingSetup) -> None:
        self.engine, self.setup = engine, setup
        self.model = engine.module
        self.weights, self.weight_ptrs = _unique_bytes(weight_tensors(self.model))
        self.gradients = None
        self.cuda = torch.cuda.is_available()
        self.saved = None
        # --torch-compile: the measured iteration runs eagerly, as the prediction counts (inductor
        # picks its own saved tensors, and saved-tensor hooks do not see inside compiled graphs);
        # the layers compile at the next iteration
        torch.compiler.set_stance("force_eager")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self.saved = SavedTensorPeak(self.weight_ptrs).__enter__()
        # snapshot the gradients when the optimizer's step() is entered, once
        call_once_before_step(engine.optimizer, self._snapshot_gradients)

    def _snapshot_gradients(self, optimizer):
        tensors = [p.grad for p in self.model.parameters() if p.grad is not None]
        for value in gradient_holders(self.engine, optimizer):  # a DeepSpeed wrapper's buffers
            tensors += list(_tensors_in(value))
        self.gradients, _ = _unique_bytes(tensors, self.weight_ptrs)

    def measure(self) -> dict[str, int]:
        torch.compiler.set_stance("default")
        if self.saved is not None:
            self.saved.__exit__(None, None, None)
        basic = basic_optimizer(self.engine)
        tensors = [p for g in basic.param_groups for p in g["params"]] + zero3_master_partitions(self.engine)
        tensors += [t for state in basic.state.values() for t in _tensors_in(state)]
        # 0-dim tensors count here: AdamW's per-parameter `step`
        seen = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel() > 0:
                ptr, size = _storage(t)
                if ptr not in self.weight_ptrs:
                    seen[ptr] = size
        optimizer = sum(seen.values())
        weights, _ = _unique_bytes(weight_tensors(self.model))
        gradients = self.gradients if self.gradients is not None else 0
        if self.cuda:
            activations = torch.cuda.max_memory_allocated() - weights - gradients - optimizer
        else:
            activations = self.saved.peak
        return dict(weights=weights, gradients=gradients, optimizer=optimizer, activations=activations)


def start_memory_probe(engine: Any, setup: TrainingSetup) -> MemoryProbe:  # engine: the DeepSpeed engine
    """Called once after the engine is built; `finish_memory_probe` after the first iteration.
    The caller holds the probe (the Trainer: `memory_probe`)."""
    return MemoryProbe(engine, setup)


def training_setup(setup: TrainingSetup, engine: Any) -> TrainingSetup:  # engine: the DeepSpeed engine
    """The configured setup (LoggingConfig.memory) with fused Adam read off the optimizer the
    engine got."""
    basic = basic_optimizer(engine)
    return dataclasses.replace(setup, fused_adam=type(basic).__name__ == "FusedAdam")


def finish_memory_probe(probe: MemoryProbe, shape: ModelShape) -> list[tuple]:
    """Every rank measures; the last rank prints measured next to predicted for every rank.
    Returns [(rank, stage, tp rank, dp rank, predicted RankMemory, measured dict)] on every rank."""
    measured = probe.measure()
    me = [torch.distributed.get_rank(), mpu.get_pipeline_model_parallel_rank(),
          mpu.get_tensor_model_parallel_rank(), mpu.get_sequence_data_parallel_rank()] + [measured[f] for f in FIELDS]
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    rows = [torch.zeros(len(me), dtype=torch.int64, device=device) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(rows, torch.tensor(me, dtype=torch.int64, device=device))
    setup = probe.setup
    predicted = {(r.stage, r.dp_rank): r for r in predict_memory(shape, setup)}
    result = []
    for row in rows:
        rank, stage, tp_rank, dp_rank, *values = row.tolist()
        result.append((rank, stage, tp_rank, dp_rank, predicted[(stage, dp_rank)],
                       dict(zip(FIELDS, values, strict=True))))
    for line in format_comparison(result, probe.cuda):
        print_rank_last(line)
    if setup.moe and setup.zero_stage > 0:
        print_rank_last("  (MoE with ZeRO: the prediction does not model the expert groups' partitioning, see above)")
    return result


def format_comparison(result: list[tuple], cuda: bool = False) -> list[str]:
    act = "peak allocated - model state" if cuda else "saved for backward"
    lines = ["memory after the first iteration, bytes, predicted / measured "
             f"(activations: estimate / {act}):",
             "   rank | stage | tp | dp |                weights |              gradients |              optimizer "
             "|            activations"]
    exact = 0
    for rank, stage, tp_rank, dp_rank, p, m in result:
        state_equal = all(getattr(p, f) == m[f] for f in FIELDS[:3])
        exact += state_equal
        cells = " | ".join(f"{getattr(p, f):>10,}/{m[f]:<11,}" for f in FIELDS)
        lines.append(f"  {rank:5d} | {stage:5d} | {tp_rank:2d} | {dp_rank:2d} | {cells}"
                     f"{'' if state_equal else ' MISMATCH'}")
    lines.append(f"  weights + gradients + optimizer: predicted == measured on {exact} of {len(result)} ranks")
    return lines


def startup_report(engine: Any, config: LoggingConfig) -> MemoryProbe:  # engine: the DeepSpeed engine
    """At startup, once the engine is built: the predicted memory table and the peak MFU is
    measured against (rank 0); then arm the measurement of the first iteration: returns the
    probe, for `finish_memory_probe` after it."""
    setup = training_setup(config.memory, engine)
    for line in format_memory_report(config.model_shape, setup):
        print_rank_0(line)
    print_rank_0(config.mfu.reason)
    return start_memory_probe(engine, setup)

