"""Mixture of experts: DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) in the transformer's MLP
slot, as Megatron-DeepSpeed builds it (`--num-experts`, `--expert-interval`, `--topk`, ...).

* Which layers: ModelShape.experts_per_layer() (layer l is MoE when l % expert_interval == 0).
* The experts are the dense layer's MLP. With --enable-expert-tensor-parallelism they are TP-split
  like ParallelMLP; otherwise each expert is whole on its EP rank (no TP tags, no collectives)
  and DeepSpeed splits the tokens over the TP ranks instead.
* Expert e of a layer is initialised from its own seed (drawn once per layer, then + e), so any
  EP layout starts from the same full set of experts (DeepSpeed would deep-copy one expert).
* The auxiliary load-balancing loss: `add_moe_loss(lm_loss)` makes backward propagate
  `lm loss + moe_loss_coeff x sum of the layers' l_aux` — it records the gradient arriving at the
  lm loss (1 / accumulation steps, times the fp16 loss scale, whatever the engine applied) and
  each MoE layer's output hands `coeff x that gradient` to its l_aux. This works unchanged under
  activation checkpointing (the recomputed layer rebuilds its l_aux graph) and leaves the value
  the engines return the lm loss; the moe loss is logged on its own (`moe loss`).
"""
from dataclasses import dataclass

import torch
from deepspeed.moe.layer import MoE
from deepspeed.utils import groups
from torch import nn
import torch.nn.functional as F

from megatron import mpu


@dataclass(frozen=True)
class MoEOptions:
    """What does not change the model's size (the shape owns num_experts, topk, EP, ...)."""
    train_capacity_factor: float = 1.0
    eval_capacity_factor: float = 1.0
    min_capacity: int = 4
    token_dropping: bool = True
    loss_coeff: float = 0.1
    top2_2nd_expert_sampling: bool = True

    @classmethod
    def from_args(cls, args):
        return cls(train_capacity_factor=args.moe_train_capacity_factor,
                   eval_capacity_factor=args.moe_eval_capacity_factor, min_capacity=args.moe_min_capacity,
                   token_dropping=args.moe_token_dropping, loss_coeff=args.moe_loss_coeff,
                   top2_2nd_expert_sampling=args.moe_top2_2nd_expert_sampling)


class ExpertMLP(nn.Module):
    """The GPT MLP whole on one rank (h -> f -> h, GeLU): an expert that is not TP-split."""

    def __init__(self, config):
        super().__init__()
        h, f = config.shape.hidden_size, config.shape.ffn_hidden_size
        self.dense_h_to_4h = _linear(h, f, config.init_method(), config.params_dtype)
        self.dense_4h_to_h = _linear(f, h, config.output_init_method(), config.params_dtype)

    def forward(self, hidden_states):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(hidden_states)))


def _linear(inputs, outputs, init_method, dtype):
    layer = nn.Linear(inputs, outputs, dtype=dtype)
    with torch.no_grad():  # as mpu's layers: the weight drawn in fp32, the bias zero
        weight = torch.empty(outputs, inputs, dtype=torch.float32)
        init_method(weight)
        layer.weight.copy_(weight)
        layer.bias.zero_()
    return layer


def _expert(config):
    if config.shape.enable_expert_tensor_parallelism:
        from .transformer import ParallelMLP
        return ParallelMLP(config)
    return ExpertMLP(config)


def expert_group_name(shape):
    return f"ep_size_{shape.moe_expert_parallel_size}"


class MoEMLP(MoE):
    """DeepSpeed's MoE module with the MLP's interface: forward(x) -> x (l_aux handled here)."""

    def __init__(self, config, num_experts):
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

    def _reinitialize_experts(self, config):
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

    def forward(self, hidden_states):
        output, l_aux, _ = super().forward(hidden_states)
        _LAST_AUX[id(self)] = self.loss_coeff * l_aux.detach().float()
        return _MoELossGradient.apply(output, l_aux, self.loss_coeff)


def mpu_ep_rank_first_expert(layer):
    """Global index of this rank's first expert in `layer` (its EP rank x experts per rank)."""
    if layer.ep_size == 1:
        return 0
    return groups._get_expert_parallel_rank(layer.expert_group_name) * layer.num_local_experts


def build_mlp(config, layer_number):
    """The MLP slot of transformer layer `layer_number` (1-based): ParallelMLP or MoEMLP."""
    num_experts = config.shape.experts_per_layer()[layer_number - 1]
    if num_experts == 1:
        from .transformer import ParallelMLP
        return ParallelMLP(config)
    return MoEMLP(config, num_experts)


# --- expert-parallel groups -----------------------------------------------------------------------

def create_expert_groups(shape, mpu_module=mpu):
    """DeepSpeed's expert-parallel and expert-data-parallel groups, created before the model is
    built (the experts' seeds and the parameter count need this rank's EP position; the engine
    later finds the groups and only attaches them to the layers). Collective: every rank calls it.
    The same two cases as deepspeed.moe.layer.MoE._create_process_groups."""
    if not shape.is_moe:
        return
    groups.mpu = mpu_module
    if expert_group_name(shape) in groups._get_expert_parallel_group_dict():
        return
    if shape.enable_expert_tensor_parallelism:
        groups._create_expert_data_and_model_parallel(shape.moe_expert_parallel_size, mpu=mpu_module)
    else:
        groups._create_expert_and_data_parallel(shape.moe_expert_parallel_size)


def attach_expert_groups(model):
    """What the DeepSpeed engine does at initialize, for a model used without an engine (tests)."""
    for module in model.modules():
        if isinstance(module, MoE) and module.deepspeed_moe.ep_group is None:
            module.set_deepspeed_parallelism()


def expert_data_parallel_rank(shape):
    return groups._get_expert_data_parallel_rank(expert_group_name(shape))


def expert_parallel_rank(shape):
    return groups._get_expert_parallel_rank(expert_group_name(shape)) if shape.is_moe else 0


# --- the auxiliary loss ----------------------------------------------------------------------------

_LAST_AUX = {}          # id(MoE layer) -> coeff x its l_aux of the latest forward (detached)
_LOSS_GRADIENT = [None]  # d(loss the engine backpropagates) / d(lm loss), set when backward starts
_TRAIN_MOE_LOSSES = []   # coeff x sum of l_aux, one per training micro-batch since the last pop


class _MoELossGradient(torch.autograd.Function):
    """Identity on the layer output; in backward, l_aux receives coeff x the lm loss's gradient,
    as if coeff x l_aux had been added to the lm loss."""

    @staticmethod
    def forward(ctx, output, l_aux, coeff):
        ctx.coeff = coeff
        return output

    @staticmethod
    def backward(ctx, grad_output):
        scale = _LOSS_GRADIENT[0]
        grad_aux = None if scale is None else ctx.coeff * scale
        return grad_output, grad_aux, None


def add_moe_loss(loss):
    """Called on the lm loss of every micro-batch of an MoE model (a no-op for a dense one)."""
    if not _LAST_AUX:
        return loss
    value = sum(_LAST_AUX.values())
    _LAST_AUX.clear()
    if torch.is_grad_enabled() and loss.requires_grad:
        _TRAIN_MOE_LOSSES.append(value)

        def remember(grad):
            _LOSS_GRADIENT[0] = grad.detach()
        loss.register_hook(remember)
    return loss


def pop_moe_loss():
    """Mean moe loss of the training micro-batches since the last call, averaged over the DP
    group like the lm loss (one all-reduce); None for a dense model."""
    if not _TRAIN_MOE_LOSSES:
        return None
    loss = torch.stack(_TRAIN_MOE_LOSSES).mean()
    _TRAIN_MOE_LOSSES.clear()
    from megatron.engine import average_over_data_parallel
    return average_over_data_parallel(loss.to(_device()))


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
