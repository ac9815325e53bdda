"""Megatron-DeepSpeed-style GPT pretraining with an exact, once-computed parameter count."""


def _rank() -> int:
    import torch.distributed as dist  # lazy: tools/param_count.py must not pay for torch
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_initialized() else 1


def _print_line(message: str) -> None:
    """One write per line: print() writes the text and the newline separately, so under `python -u`
    another rank's line sharing the launcher's stdout could land between them."""
    import sys
    sys.stdout.write(f"{message}\n")
    sys.stdout.flush()


def print_rank_0(message: str) -> None:
    if _rank() == 0:
        _print_line(message)


def print_rank_last(message: str) -> None:
    """The last rank sees the loss under pipeline parallelism, so it prints the log line."""
    if _rank() == _world_size() - 1:
        _print_line(message)


from .runtime.global_vars import get_args, get_timers, get_tokenizer  # noqa: E402,F401
