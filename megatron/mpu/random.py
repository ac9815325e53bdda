"""TP-aware RNG and activation checkpointing.

Dropout on activations that are *split* across TP ranks (attention probabilities) must differ
between TP ranks, while dropout on *replicated* activations (hidden states) must be identical on
all of them. The tracker keeps a separate generator state for the former ("model-parallel-rng").
Works on CPU (torch's default generator) and CUDA (the current device's generator).
"""
import contextlib
from argparse import Namespace
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from .parallel_state import (
    get_pipeline_model_parallel_rank,
    get_sequence_parallel_rank,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)

_MODEL_PARALLEL_RNG = "model-parallel-rng"
_DS_CHECKPOINTING = False  # set by configure_deepspeed_checkpointing()


@torch.compiler.disable  # --torch-compile: RNG state moves stay eager
def _get_state() -> torch.Tensor:
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state()


@torch.compiler.disable  # --torch-compile: RNG state moves stay eager
def _set_state(state: torch.Tensor) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


class RNGStatesTracker:
    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self.states = {}

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states = dict(states)

    def add(self, name: str, seed: int) -> None:
        if name in self.states:
            raise ValueError(f"RNG state {name} already exists")
        orig = _get_state()
        if torch.cuda.is_available():
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        self.states[name] = _get_state()
        _set_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        orig = _get_state()
        _set_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = _get_state()
            _set_state(orig)


_TRACKER = RNGStatesTracker()


def get_cuda_rng_tracker() -> Any:
    """The tracker in use (DeepSpeed's when its activation checkpointing is configured, because
    its checkpoint function restores only its own tracker's states on recompute)."""
    if _DS_CHECKPOINTING:
        import deepspeed
        return deepspeed.checkpointing.get_cuda_rng_tracker()
    return _TRACKER


def model_parallel_seed(seed: int) -> None:
    """Seed the default generator (same on all TP ranks, offset by stage) and the
    model-parallel generator (different per TP rank, as Megatron does, and per DeepSpeed-Ulysses
    SP rank: each holds other tokens and heads, so its dropout masks must be its own; at SP 1 the
    seeds are Megatron's)."""
    seed = seed + 100 * get_pipeline_model_parallel_rank()
    tp_seed = (seed + 2718 + get_tensor_model_parallel_rank()
               + get_tensor_model_parallel_world_size() * get_sequence_parallel_rank())
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    tracker = get_cuda_rng_tracker()
    tracker.reset()
    tracker.add(_MODEL_PARALLEL_RNG, tp_seed)


class _TensorParallelView:
    """deepspeed.checkpointing partitions activations over what it calls the model-parallel
    group; the ranks that hold the same activations are the TP group, not TP x PP."""

    def __init__(self, mpu: ModuleType) -> None:
        self.get_model_parallel_rank = mpu.get_tensor_model_parallel_rank
        self.get_model_parallel_group = mpu.get_tensor_model_parallel_group
        self.get_model_parallel_world_size = mpu.get_tensor_model_parallel_world_size
        self.get_data_parallel_rank = mpu.get_data_parallel_rank
        self.get_data_parallel_group = mpu.get_data_parallel_group
        self.get_data_parallel_world_size = mpu.get_data_parallel_world_size


def configure_deepspeed_checkpointing(args: Namespace, mpu: ModuleType) -> None:
    """--deepspeed-activation-checkpointing: use deepspeed.checkpointing (partitioned /
    contiguous / CPU activation checkpoints) instead of our checkpoint function."""
    global _DS_CHECKPOINTING
    import deepspeed
    deepspeed.checkpointing.configure(
        _TensorParallelView(mpu),
        partition_activations=args.partition_activations,
        contiguous_checkpointing=args.contigious_checkpointing,
        num_checkpoints=args.num_layers,
        checkpoint_in_cpu=args.checkpoint_in_cpu,
        synchronize=args.synchronize_each_layer,
        profile=args.profile_backward,
    )
    _DS_CHECKPOINTING = True


class CheckpointFunction(torch.autograd.Function):
    """Recompute `function` in backward, replaying the default and the tracker's RNG states so
    that dropout masks of the recomputation equal the original ones."""

    @staticmethod
    def forward(ctx: Any, function: Callable[..., Any], *args: torch.Tensor) -> Any:
        ctx.function = function
        ctx.fwd_rng_state = _get_state()
        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        ctx.fwd_tracker_states = _TRACKER.get_states()
        with torch.no_grad():
            outputs = function(*args)
        ctx.save_for_backward(*args)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        rng, cpu_rng, tracker = _get_state(), torch.get_rng_state(), _TRACKER.get_states()
        _set_state(ctx.fwd_rng_state)
        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        _TRACKER.set_states(ctx.fwd_tracker_states)
        try:
            with torch.enable_grad():
                outputs = ctx.function(*inputs)
        finally:
            _set_state(rng)
            torch.set_rng_state(cpu_rng)
            _TRACKER.set_states(tracker)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        # an output that does not depend on the inputs' graph (e.g. a value passed through) has nothing to do
        pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True) if out.requires_grad]
        torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        return (None,) + tuple(x.grad for x in inputs)


def checkpoint(function: Callable[..., Any], *args: torch.Tensor) -> Any:
    if _DS_CHECKPOINTING:
        import deepspeed
        return deepspeed.checkpointing.checkpoint(function, *args)
    return CheckpointFunction.apply(function, *args)
