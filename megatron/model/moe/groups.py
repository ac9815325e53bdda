"""DeepSpeed's expert-parallel (EP) and expert-data-parallel (EDP) process groups: created before
the model is built, attached to the MoE layers, and this rank's position in them; plus, on gloo,
the token gather over the TP group that DeepSpeed's MoE runs with whole experts at TP > 1."""
from __future__ import annotations

from types import ModuleType

import torch
from deepspeed.moe.layer import MoE
from torch import nn

from megatron import mpu
from megatron.runtime import deepspeed_internals as ds_internals

from ..shape import ModelShape


def expert_group_name(shape: ModelShape) -> str:
    """DeepSpeed's name of the EP group of an MoE layer (MoE.expert_group_name)."""
    return f"ep_size_{shape.moe_expert_parallel_size}"


def create_expert_groups(shape: ModelShape, mpu_module: ModuleType = mpu) -> None:
    """DeepSpeed's expert-parallel and expert-data-parallel groups, created before the model is
    built (the experts' seeds and the parameter count need this rank's EP position; the engine
    later finds the groups and only attaches them to the layers). Collective: every rank calls it.
    The same two cases as deepspeed.moe.layer.MoE._create_process_groups."""
    if not shape.is_moe:
        return
    _use_shaped_token_gather_on_gloo()
    ds_internals.create_expert_groups(shape.moe_expert_parallel_size, shape.enable_expert_tensor_parallelism,
                                      mpu_module)


def attach_expert_groups(model: nn.Module) -> None:
    """What the DeepSpeed engine does at initialize, for a model used without an engine (tests)."""
    for module in model.modules():
        if isinstance(module, MoE) and module.deepspeed_moe.ep_group is None:
            module.set_deepspeed_parallelism()


def mpu_ep_rank_first_expert(layer: MoE) -> int:
    """Global index of this rank's first expert in `layer` (its EP rank x experts per rank)."""
    if layer.ep_size == 1:
        return 0
    return ds_internals.expert_parallel_rank(layer.expert_group_name) * layer.num_local_experts


def _gather_tokens_over_tp(input_: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """DeepSpeed's token gather over the TP group (mappings._gather_tokens: every TP rank's tokens,
    concatenated along `dim`) through a list all-gather: DeepSpeed gathers into a flat buffer, and
    gloo's all_gather_into_tensor only takes an output shaped [world x first dim, ...]."""
    world = mpu.get_tensor_model_parallel_world_size()
    if world == 1:
        return input_
    input_ = input_.contiguous()
    parts = [torch.empty_like(input_) for _ in range(world)]
    torch.distributed.all_gather(parts, input_, group=mpu.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=dim)


def _use_shaped_token_gather_on_gloo() -> None:
    """With TP > 1 and whole experts, DeepSpeed's MoE splits the tokens over the TP ranks and gathers
    them back (forward of the combine, backward of the split). On gloo that gather is swapped for
    `_gather_tokens_over_tp`, the same result; nccl keeps DeepSpeed's."""
    if torch.distributed.get_backend() == "gloo":
        ds_internals.replace_token_gather(_gather_tokens_over_tp)
