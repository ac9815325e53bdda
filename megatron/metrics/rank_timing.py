"""--timing-log-option {max,minmax,all} (Megatron-LM's Timers): every rank's own iteration time over
the log interval (Megatron's `interval-time` timer, in ms per iteration), gathered at each log line,
reported as Megatron-LM reports it (the max, the (min, max) or each rank's) with the slowest rank
named, in the log and in TensorBoard. Without the flag nothing is gathered (no collective)."""
from typing import Any

import torch

TIMER = "interval-time"  # Megatron's name of the iteration-time timer


def gather_rank_times(ms_per_iteration: float) -> list[float]:
    """Each rank's value, in rank order (one all-gather; every rank calls it)."""
    mine = torch.tensor([ms_per_iteration], dtype=torch.float64)
    if torch.cuda.is_available():
        mine = mine.cuda()
    every = [torch.zeros_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    return [float(t.item()) for t in every]


def slowest_rank(times: list[float]) -> int:
    return max(range(len(times)), key=times.__getitem__)


def timing_lines(option: str, times: list[float]) -> str:
    """Megatron-LM's block (megatron/core/timers.py), with the slowest rank named."""
    name = (TIMER + " ").ljust(48, ".")
    slow = f"slowest rank: {slowest_rank(times)}"
    if option == "max":
        return f"max time across ranks (ms):\n    {name}: {max(times):.2f} | {slow}"
    if option == "minmax":
        return f"(min, max) time across ranks (ms):\n    {name}: ({min(times):.2f}, {max(times):.2f}) | {slow}"
    ranks = "".join(f"\n     rank {r:2d}: {t:.2f}" for r, t in enumerate(times))
    return f"times across ranks (ms):\n  {TIMER}:{ranks}\n  {slow}"


def write_timing(writer: Any, option: str, times: list[float], iteration: int) -> None:
    """The same in TensorBoard: max (and min; or each rank's) ms per iteration, and the slowest rank."""
    writer.add_scalar("iteration-time/iteration-time max (ms)", max(times), iteration)
    if option == "minmax":
        writer.add_scalar("iteration-time/iteration-time min (ms)", min(times), iteration)
    if option == "all":
        for rank, t in enumerate(times):
            writer.add_scalar(f"iteration-time/iteration-time rank {rank} (ms)", t, iteration)
    writer.add_scalar("iteration-time/slowest rank", slowest_rank(times), iteration)
