"""What the ranks agree on during checkpointing, in one collective each: rank 0's decision
(a lock refused, a disk without room) or every rank's outcome (a failed write, its share of the
manifest). Without torch.distributed (tools, in-process checks) a rank agrees with itself."""
from typing import Any

import torch.distributed as dist


def from_rank_0(value: Any) -> Any:
    """Rank 0's value on every rank (one broadcast)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any) -> list:
    """Every rank's value, in rank order, on every rank (one all-gather)."""
    if not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def rank_and_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
