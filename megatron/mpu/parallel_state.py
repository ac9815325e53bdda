"""Tensor / pipeline / data (/ sequence) parallel groups.

DeepSpeed's `PipeModelDataParallelTopology` is the single source of truth for which rank sits
where (axes pipe, data, model; model varies fastest), so the groups built here are exactly the
ones DeepSpeed's pipeline grid builds from the same topology object. DeepSpeed-Ulysses
(sequence_parallel_size > 1, TP = PP = 1 by validation) adds a `sequence` axis between data and
model (DeepSpeed's general ProcessTopology): the SP ranks of one replica are consecutive, as in
Microsoft's fork. DeepSpeed's engine asks this module for the sequence-parallel group (the
all-to-all of DistributedAttention) and the sequence-data-parallel group (SP x DP: the gradient
reduction and the ZeRO partition)."""
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from megatron.runtime.deepspeed_internals import pipe_model_data_parallel_topology, process_topology

__all__ = [
    "initialize_model_parallel",
    "get_topology",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_pipeline_model_parallel_group",
    "get_pipeline_model_parallel_world_size",
    "get_pipeline_model_parallel_rank",
    "get_data_parallel_group",
    "get_data_parallel_world_size",
    "get_data_parallel_rank",
    "get_model_parallel_group",
    "get_model_parallel_world_size",
    "get_model_parallel_rank",
    "get_sequence_parallel_group",
    "get_sequence_parallel_world_size",
    "get_sequence_parallel_rank",
    "get_sequence_data_parallel_group",
    "get_sequence_data_parallel_world_size",
    "get_sequence_data_parallel_rank",
]

_TOPOLOGY: Any = None  # DeepSpeed's PipeModelDataParallelTopology (see deepspeed_internals)
_TP_GROUP: dist.ProcessGroup | None = None  # ranks holding the other slices of the same layers
_PP_GROUP: dist.ProcessGroup | None = None  # ranks holding the other stages of the same TP slice
_DP_GROUP: dist.ProcessGroup | None = None  # replicas of the same (stage, slice)
_MP_GROUP: dist.ProcessGroup | None = None  # TP x PP: one whole model replica
_SP_GROUP: dist.ProcessGroup | None = None  # ranks holding the other chunks of the same sequences
_SDP_GROUP: dist.ProcessGroup | None = None  # SP x DP: the ranks that hold the same weights
_TP_RANKS: list[int] | None = None


def initialize_model_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                              sequence_parallel_size: int = 1, timeout: timedelta | None = None) -> None:
    """Create every group on every rank, in the same order (new_group is collective). timeout:
    --distributed-timeout-minutes, given to each group as Megatron-LM does (a new group does not
    inherit the default group's; None: torch's default)."""
    global _TOPOLOGY, _TP_GROUP, _PP_GROUP, _DP_GROUP, _MP_GROUP, _SP_GROUP, _SDP_GROUP, _TP_RANKS
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    tp, pp, sp = tensor_model_parallel_size, pipeline_model_parallel_size, sequence_parallel_size
    assert world_size % (tp * pp * sp) == 0, "validated in arguments.py"
    dp = world_size // (tp * pp * sp)
    if sp == 1:
        topo = pipe_model_data_parallel_topology(num_pp=pp, num_mp=tp, num_dp=dp)
    else:
        topo = process_topology(["pipe", "data", "sequence", "model"], [pp, dp, sp, tp])

    def _mine(lists):
        found = None
        for ranks in lists:
            group = dist.new_group(ranks=ranks, timeout=timeout)
            if rank in ranks:
                found = (group, ranks)
        return found

    _TP_GROUP, _TP_RANKS = _mine(topo.get_axis_comm_lists("model"))
    _PP_GROUP, _ = _mine(topo.get_axis_comm_lists("pipe"))
    _DP_GROUP, _ = _mine(topo.get_axis_comm_lists("data"))
    if sp == 1:
        _MP_GROUP, _ = _mine([topo.filter_match(data=d) for d in range(dp)])
        _SP_GROUP, _SDP_GROUP = None, _DP_GROUP  # no all-to-all without SP; the weights' holders are DP
    else:
        _MP_GROUP, _ = _mine([topo.filter_match(data=d, sequence=q) for d in range(dp) for q in range(sp)])
        _SP_GROUP, _ = _mine(topo.get_axis_comm_lists("sequence"))
        _SDP_GROUP, _ = _mine([topo.filter_match(pipe=p, model=m) for p in range(pp) for m in range(tp)])
    _TOPOLOGY = topo


def get_topology() -> Any:
    return _TOPOLOGY


def _coord() -> Any:
    return _TOPOLOGY.get_coord(dist.get_rank())


# --- tensor model parallel -------------------------------------------------------------
def get_tensor_model_parallel_group() -> dist.ProcessGroup | None:
    return _TP_GROUP


def get_tensor_model_parallel_world_size() -> int:
    return _TOPOLOGY.get_dim("model")


def get_tensor_model_parallel_rank() -> int:
    return _coord().model


def get_tensor_model_parallel_src_rank() -> int:
    """Global rank of TP rank 0 in this rank's TP group."""
    return _TP_RANKS[0]


# --- pipeline model parallel -----------------------------------------------------------
def get_pipeline_model_parallel_group() -> dist.ProcessGroup | None:
    return _PP_GROUP


def get_pipeline_model_parallel_world_size() -> int:
    return _TOPOLOGY.get_dim("pipe")


def get_pipeline_model_parallel_rank() -> int:
    return _coord().pipe


# --- data parallel ---------------------------------------------------------------------
def get_data_parallel_group() -> dist.ProcessGroup | None:
    return _DP_GROUP


def get_data_parallel_world_size() -> int:
    return _TOPOLOGY.get_dim("data")


def get_data_parallel_rank() -> int:
    return _coord().data


# --- model parallel = TP x PP (one replica). With PP=1 (the only case in which DeepSpeed's
# non-pipeline engine receives this module as `mpu`) it is the TP group, as DeepSpeed expects.
def get_model_parallel_group() -> dist.ProcessGroup | None:
    return _MP_GROUP


def get_model_parallel_world_size() -> int:
    return get_tensor_model_parallel_world_size() * get_pipeline_model_parallel_world_size()


def get_model_parallel_rank() -> int:
    return dist.get_rank(group=_MP_GROUP)


# --- DeepSpeed-Ulysses sequence parallel (DeepSpeed's engine and DistributedAttention read these) --
def get_sequence_parallel_group() -> dist.ProcessGroup | None:
    return _SP_GROUP


def get_sequence_parallel_world_size() -> int:
    return _TOPOLOGY.get_dim("sequence") if "sequence" in _TOPOLOGY.get_axis_names() else 1


def get_sequence_parallel_rank() -> int:
    return _coord().sequence if get_sequence_parallel_world_size() > 1 else 0


def get_sequence_data_parallel_group() -> dist.ProcessGroup | None:
    """The ranks that hold the same weights: DeepSpeed sums gradients over them (and divides by
    the DP size only: each SP rank's loss is its own tokens' share of the sequence's mean) and
    partitions the ZeRO state over them."""
    return _SDP_GROUP


def get_sequence_data_parallel_world_size() -> int:
    return get_sequence_parallel_world_size() * get_data_parallel_world_size()


def get_sequence_data_parallel_rank() -> int:
    return dist.get_rank(group=_SDP_GROUP)
