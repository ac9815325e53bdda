"""The MoE layer: DeepSpeed's MoE module (deepspeed.moe.layer.MoE) in the transformer's MLP slot,
its experts built by the dense layer's MLP class, its load-balancing loss attached to its output."""
from __future__ import annotations

import torch
from deepspeed.moe.layer import MoE

from ..config import GPTConfig
from ..mlp import ParallelMLP
from .aux_loss import attach_aux_loss
from .groups import mpu_ep_rank_first_expert


def _expert(config: GPTConfig) -> ParallelMLP:
    """One expert: the dense layer's MLP (ParallelMLP, so every MLP variant -- GLU kind, ffn size,
    biases -- applies), TP-split with --enable-expert-tensor-parallelism, else whole on this rank."""
    return ParallelMLP(config, tensor_parallel=config.shape.enable_expert_tensor_parallelism)


class MoEMLP(MoE):
    """DeepSpeed's MoE module with the MLP's interface: forward(x) -> x. The layer's
    `moe_loss_coeff x l_aux` reaches the gradient through the output (aux_loss.attach_aux_loss)."""

    def __init__(self, config: GPTConfig, num_experts: int) -> None:
        shape, options = config.shape, config.moe
        super().__init__(shape.hidden_size, _expert(config), num_experts=num_experts,
                         ep_size=shape.moe_expert_parallel_size, k=shape.topk,
                         use_residual=shape.mlp_type == "residual",
                         capacity_factor=options.train_capacity_factor,
                         eval_capacity_factor=options.eval_capacity_factor, min_capacity=options.min_capacity,
                         drop_tokens=options.token_dropping,
                         enable_expert_tensor_parallelism=shape.enable_expert_tensor_parallelism,
                         top2_2nd_expert_sampling=options.top2_2nd_expert_sampling)
        self.loss_coeff = options.loss_coeff
        self._reinitialize_experts(config)

    def _reinitialize_experts(self, config: GPTConfig) -> None:
        """Expert e (global index) from seed base + e: the same experts at every EP size."""
        base = int(torch.randint(0, 2 ** 31 - 1, (1,)).item())  # same draw on every rank
        experts = self.deepspeed_moe.experts
        first = mpu_ep_rank_first_expert(self)
        for local, old in enumerate(experts.deepspeed_experts):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(base + first + local)
                fresh = _expert(config)
            # DeepSpeed deep-copied the template expert, and a deep-copied Parameter loses its
            # attributes: the TP tags come back from the fresh expert with its values
            fresh_params = dict(fresh.named_parameters())
            for name, param in old.named_parameters():
                with torch.no_grad():
                    param.copy_(fresh_params[name])
                for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
                    if hasattr(fresh_params[name], attr):
                        setattr(param, attr, getattr(fresh_params[name], attr))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[s, b, h] -> [s, b, h], the same tensor values as DeepSpeed's output."""
        output, l_aux, _ = super().forward(hidden_states)
        return attach_aux_loss(output, self.loss_coeff * l_aux)
