"""Mixture of experts: DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) in the transformer's MLP
slot, as Megatron-DeepSpeed builds it (`--num-experts`, `--expert-interval`, `--topk`, ...).

* Which layers: ModelShape.experts_per_layer() (layer l is MoE when l % expert_interval == 0).
* The experts are the dense layer's MLP, built by the same class (ParallelMLP: GeLU or any GLU,
  with or without biases, the same ffn size). With --enable-expert-tensor-parallelism they are
  TP-split like it; otherwise each expert is whole on its EP rank (no TP tags, no collectives)
  and DeepSpeed splits the tokens over the TP ranks instead.
* Expert e of a layer is initialised from its own seed (drawn once per layer, then + e), so any
  EP layout starts from the same full set of experts (DeepSpeed would deep-copy one expert).
* The auxiliary load-balancing loss (`moe loss` = moe_loss_coeff x sum of the layers' l_aux)
  travels with the hidden states to the lm loss, where `add_moe_loss` adds it to the gradient but
  not to the value: the engines return the lm loss, and the moe loss is logged on its own.
"""
import contextlib
from dataclasses import dataclass

import torch
from deepspeed.moe.layer import MoE
from deepspeed.utils import groups
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


def _expert(config):
    """One expert: the dense layer's MLP (ParallelMLP, so every MLP variant -- GLU kind, ffn size,
    biases -- applies), TP-split with --enable-expert-tensor-parallelism, else whole on this rank."""
    from .transformer import ParallelMLP
    return ParallelMLP(config, tensor_parallel=config.shape.enable_expert_tensor_parallelism)


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
        """(output, moe_loss_coeff x l_aux)."""
        output, l_aux, _ = super().forward(hidden_states)
        return output, self.loss_coeff * l_aux


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
    _use_shaped_token_gather_on_gloo()
    if expert_group_name(shape) in groups._get_expert_parallel_group_dict():
        return
    if shape.enable_expert_tensor_parallelism:
        groups._create_expert_data_and_model_parallel(shape.moe_expert_parallel_size, mpu=mpu_module)
    else:
        groups._create_expert_and_data_parallel(shape.moe_expert_parallel_size)


def _gather_tokens_over_tp(input_, dim=0):
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


def _use_shaped_token_gather_on_gloo():
    """With TP > 1 and whole experts, DeepSpeed's MoE splits the tokens over the TP ranks and gathers
    them back (forward of the combine, backward of the split). On gloo that gather is swapped for
    `_gather_tokens_over_tp`, the same result; nccl keeps DeepSpeed's."""
    from deepspeed.moe import mappings
    if torch.distributed.get_backend() == "gloo":
        mappings._gather_tokens = _gather_tokens_over_tp


@contextlib.contextmanager
def every_tp_rank_writes_its_files(engine):
    """While DeepSpeed saves an MoE model: a rank writes its expert files, optimizer state and
    model state when it is expert-data-parallel rank 0 (DeepSpeed's rule) or in DP replica 0.
    With whole experts DeepSpeed's expert-data-parallel groups hold TP peers (their gradients are
    summed there, each TP rank having run a slice of the experts' capacity), so with EP < TP its
    rule alone would write nothing for TP ranks >= EP, and the checkpoint would not load."""
    checkpoint_engine = engine.checkpoint_engine
    deepspeed_rule = checkpoint_engine.is_data_parallel_writer
    checkpoint_engine.is_data_parallel_writer = \
        lambda rank: deepspeed_rule(rank) or mpu.get_data_parallel_rank() == 0
    try:
        yield
    finally:
        del checkpoint_engine.is_data_parallel_writer  # the class's method again


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
# Each MoE layer adds `coeff x l_aux` to a running `moe_loss` that travels with the hidden states
# (ParallelTransformerLayer.forward) to the lm loss, so autograd gives every gate its gradient on
# both engines, at any PP (across a stage boundary it rides in the activation, `pack_moe_loss`),
# under activation checkpointing and fp16 loss scaling alike.

_TRAIN_MOE_LOSSES = []  # the moe loss of each training micro-batch since the last pop (detached)


class _LossWithMoELoss(torch.autograd.Function):
    """Value: the lm loss (what the engines return and the log calls `lm loss`); gradient: that of
    lm loss + moe loss, so backward sees the sum."""

    @staticmethod
    def forward(ctx, lm_loss, moe_loss):
        ctx.moe_shape = moe_loss.shape
        return lm_loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.expand(ctx.moe_shape)


def add_moe_loss(lm_loss, moe_loss):
    """The loss backward runs on: lm loss + moe loss in gradient, lm loss in value (None: dense)."""
    if moe_loss is None:
        return lm_loss
    return _LossWithMoELoss.apply(lm_loss, moe_loss.to(lm_loss.dtype))


def record_moe_loss(moe_loss):
    """For the log: the moe loss a training micro-batch's forward added on this rank (called once
    per micro-batch, outside any recomputation; on a pipeline stage, the stage's own layers' part)."""
    if torch.is_grad_enabled():
        _TRAIN_MOE_LOSSES.append(moe_loss.detach().float().sum())


def pack_moe_loss(hidden_states, moe_loss):
    """One tensor for a pipeline stage boundary ([s + 1, b, h]: the moe loss in the extra row),
    because DeepSpeed backpropagates a stage's outputs one tensor at a time, and a checkpointed
    chunk with two outputs would then be recomputed twice. Only the gradient that flows back
    through the extra row matters; the log takes its values from record_moe_loss."""
    s, b, h = hidden_states.shape
    if moe_loss is None:  # a stage without MoE layers
        moe_loss = hidden_states.new_zeros(1)
    row = F.pad(moe_loss.to(hidden_states.dtype).reshape(1, 1, 1), (0, h - 1, 0, b - 1))
    return torch.cat([hidden_states, row])


def unpack_moe_loss(packed):
    return packed[:-1], packed[-1, 0, :1].float()


def pop_moe_loss():
    """Mean moe loss of the training micro-batches since the last call: summed over the pipeline
    stages (each recorded its layers' part), averaged over DP like the lm loss; None for a dense
    model. Collective on every rank of an MoE model."""
    if not _TRAIN_MOE_LOSSES:
        return None
    loss = torch.stack(_TRAIN_MOE_LOSSES).mean().to(_device())
    _TRAIN_MOE_LOSSES.clear()
    if mpu.get_pipeline_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(loss, group=mpu.get_pipeline_model_parallel_group())
    from megatron.engine import average_over_data_parallel
    return average_over_data_parallel(loss)


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
