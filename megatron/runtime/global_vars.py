"""Process-wide singletons: args, timers, tokenizer. (The TensorBoard writer is not one: the
Trainer's MetricsProcessor owns it, megatron/metrics/processor.py.)"""
import argparse
import time
from typing import Any

_GLOBAL_ARGS = None
_GLOBAL_TIMERS = None
_GLOBAL_TOKENIZER = None


def get_args() -> argparse.Namespace:
    assert _GLOBAL_ARGS is not None, "args are not initialized (call initialize_megatron first)"
    return _GLOBAL_ARGS


def set_args(args: argparse.Namespace) -> None:
    global _GLOBAL_ARGS
    _GLOBAL_ARGS = args


def get_timers() -> "Timers":
    global _GLOBAL_TIMERS
    if _GLOBAL_TIMERS is None:
        _GLOBAL_TIMERS = Timers()
    return _GLOBAL_TIMERS


def get_tokenizer() -> Any:  # the tokenizer build_tokenizer made (several classes), or None
    return _GLOBAL_TOKENIZER


def set_tokenizer(tokenizer: Any) -> None:
    global _GLOBAL_TOKENIZER
    _GLOBAL_TOKENIZER = tokenizer


class _Timer:
    def __init__(self):
        self.elapsed_ = 0.0
        self.started = None

    def start(self) -> None:
        self.started = time.time()

    def stop(self) -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # time the device work, not the kernel launches
        self.elapsed_ += time.time() - self.started
        self.started = None

    def elapsed(self, reset: bool = True) -> float:
        value = self.elapsed_
        if reset:
            self.elapsed_ = 0.0
        return value


class Timers:
    def __init__(self):
        self.timers = {}

    def __call__(self, name):
        if name not in self.timers:
            self.timers[name] = _Timer()
        return self.timers[name]
