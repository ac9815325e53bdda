"""Mixture of experts: DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) in the transformer's MLP
slot, as Megatron-DeepSpeed builds it (`--num-experts`, `--expert-interval`, `--topk`, ...).

* Which layers: ModelShape.experts_per_layer() (layer l is MoE when l % expert_interval == 0);
  transformer.build_mlp puts an MoEMLP there.
* layer.py: the experts are the dense layer's MLP, built by the same class (ParallelMLP: GeLU or
  any GLU, with or without biases, the same ffn size). With --enable-expert-tensor-parallelism they
  are TP-split like it; otherwise each expert is whole on its EP rank (no TP tags, no collectives)
  and DeepSpeed splits the tokens over the TP ranks instead. Expert e of a layer is initialised
  from its own seed (drawn once per layer, then + e), so any EP layout starts from the same full
  set of experts (DeepSpeed would deep-copy one expert).
* aux_loss.py: the load-balancing loss rides on the layer output's gradient (an autograd function,
  as Megatron-core's MoEAuxLossAutoScaler); layers return plain hidden states.
* groups.py: DeepSpeed's expert-parallel groups and the gloo token gather; options.py: MoEOptions;
  checkpoint_writer.py: which ranks write files while DeepSpeed saves an MoE model.
"""
from .checkpoint_writer import every_tp_rank_writes_its_files
from .groups import attach_expert_groups, create_expert_groups, mpu_ep_rank_first_expert
from .options import MoEOptions

# MoEMLP (layer.py) is imported from its module: it builds experts from the dense MLP, which reads
# the model config, and the config imports MoEOptions from this package
__all__ = ["MoEOptions", "attach_expert_groups", "create_expert_groups", "every_tp_rank_writes_its_files",
           "mpu_ep_rank_first_expert"]
