"""The MoE settings that do not change the model's size (the shape owns num_experts, topk, EP, ...)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class MoEOptions:
    """Capacity, token dropping, the loss coefficient and the 2nd-expert sampling of top-2."""
    train_capacity_factor: float = 1.0
    eval_capacity_factor: float = 1.0
    min_capacity: int = 4
    token_dropping: bool = True
    loss_coeff: float = 0.1
    top2_2nd_expert_sampling: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MoEOptions:
        return cls(train_capacity_factor=args.moe_train_capacity_factor,
                   eval_capacity_factor=args.moe_eval_capacity_factor, min_capacity=args.moe_min_capacity,
                   token_dropping=args.moe_token_dropping, loss_coeff=args.moe_loss_coeff,
                   top2_2nd_expert_sampling=args.moe_top2_2nd_expert_sampling)
