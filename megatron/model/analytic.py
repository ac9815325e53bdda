"""What a ModelShape builds, from the shape alone (torch-free): every parameter tensor with its
full shape, TP split and pipeline placement (the parameter table), the exact counts that follow
from it, and the FLOPs formula.

The measured count in megatron/utils.py must equal `analytic_parameter_counts` exactly; the
trainer cross-checks the two at startup and tools/param_count.py prints this side.
"""
from dataclasses import dataclass
from math import prod
from typing import NamedTuple

COMPONENTS = ("word_embeddings", "position_embeddings", "attention", "mlp", "layernorm")
# Kaplan et al.: "excluding all vocabulary and positional embeddings"
EMBEDDING_COMPONENTS = ("word_embeddings", "position_embeddings")


class ParamSpec(NamedTuple):
    """One parameter tensor. `layer` is its index in GPTModelPipe's layer list (0: embedding,
    1..L: transformer layers, L+1: final LayerNorm, L+2: the tied output copy of the embedding),
    `key` its name inside that layer; `partition_dim` is the TP split (None: replicated)."""
    layer: int
    key: str
    component: str
    shape: tuple
    partition_dim: int = None

    def local_numel(self, tp):
        return prod(self.shape) // (1 if self.partition_dim is None else tp)


def _embedding_specs(shape, layer):
    h = shape.hidden_size
    return [ParamSpec(layer, "word_embeddings.weight", "word_embeddings", (shape.padded_vocab_size, h), 0),
            ParamSpec(layer, "position_embeddings.weight", "position_embeddings", (shape.max_position_embeddings, h))]


def _layernorm_specs(layer, prefix, h):
    return [ParamSpec(layer, f"{prefix}weight", "layernorm", (h,)),
            ParamSpec(layer, f"{prefix}bias", "layernorm", (h,))]


def _transformer_layer_specs(shape, layer):
    h, f = shape.hidden_size, shape.ffn_hidden_size
    return (_layernorm_specs(layer, "input_layernorm.", h) + [
        ParamSpec(layer, "self_attention.query_key_value.weight", "attention", (3 * h, h), 0),
        ParamSpec(layer, "self_attention.query_key_value.bias", "attention", (3 * h,), 0),
        ParamSpec(layer, "self_attention.dense.weight", "attention", (h, h), 1),
        ParamSpec(layer, "self_attention.dense.bias", "attention", (h,)),
    ] + _layernorm_specs(layer, "post_attention_layernorm.", h) + [
        ParamSpec(layer, "mlp.dense_h_to_4h.weight", "mlp", (f, h), 0),
        ParamSpec(layer, "mlp.dense_h_to_4h.bias", "mlp", (f,), 0),
        ParamSpec(layer, "mlp.dense_4h_to_h.weight", "mlp", (h, f), 1),
        ParamSpec(layer, "mlp.dense_4h_to_h.bias", "mlp", (h,)),
    ])


def parameter_table(shape):
    """Every parameter of the model once (the tied output layer is the word embedding)."""
    specs = _embedding_specs(shape, 0)
    for i in range(shape.num_layers):
        specs += _transformer_layer_specs(shape, i + 1)
    return specs + _layernorm_specs(shape.num_layers + 1, "", shape.hidden_size)


def stage_of_layer(shape, layer):
    """Pipeline stage holding GPTModelPipe layer `layer` (the embedding on the first stage, the
    final LayerNorm and output layer on the last)."""
    if layer == 0:
        return 0
    bound = 0
    for stage, n in enumerate(shape.layers_per_stage()):
        bound += n
        if layer <= bound:
            return stage
    return shape.pipeline_model_parallel_size - 1


def stage_parameters(shape, stage):
    """[(spec, owned)] that each TP rank of `stage` holds. With PP > 1 the last stage holds a copy
    of the whole embedding module for the tied output layer (DeepSpeed's TiedLayerSpec); the
    first stage owns it."""
    held = [(spec, True) for spec in parameter_table(shape) if stage_of_layer(shape, spec.layer) == stage]
    if shape.pipeline_model_parallel_size > 1 and stage == shape.pipeline_model_parallel_size - 1:
        held += [(spec, False) for spec in _embedding_specs(shape, shape.num_layers + 2)]
    return held


class StageCount(NamedTuple):
    layers: int  # transformer layers
    held: int    # elements held by the stage's TP rank 0 (what DeepSpeed logs as STAGE_PARAMS)
    owned: int   # elements owned by the stage, all TP ranks together


@dataclass(frozen=True)
class ParameterCounts:
    """The model's exact size: per component and per pipeline stage."""
    components: dict
    stages: tuple

    @property
    def total(self):
        return sum(self.components.values())

    @property
    def no_embedding(self):
        return self.total - sum(self.components[c] for c in EMBEDDING_COMPONENTS)


def analytic_parameter_counts(shape):
    components = dict.fromkeys(COMPONENTS, 0)
    for spec in parameter_table(shape):
        components[spec.component] += prod(spec.shape)
    tp = shape.tensor_model_parallel_size
    stages = []
    for stage, layers in enumerate(shape.layers_per_stage()):
        held = stage_parameters(shape, stage)
        stages.append(StageCount(layers, sum(spec.local_numel(tp) for spec, _ in held),
                                 sum(prod(spec.shape) for spec, owned in held if owned)))
    return ParameterCounts(components, tuple(stages))


# --- FLOPs -----------------------------------------------------------------------------------

def flops_per_sample(shape, checkpoint_activations):
    """Model FLOPs of one training sample (forward + backward), Narayanan et al. 2021 eq. 3
    generalised to any FFN size. Per layer, forward: QKV 6sh^2, attention scores and context
    2 x 2s^2h, output projection 2sh^2, MLP 4shf. Backward costs twice the forward; activation
    recomputation adds one more forward (factor 4 instead of 3). The logit layer 2shV is never
    recomputed (factor 3). Elementwise work (LayerNorm, GeLU, softmax, biases) is ignored and
    causal attention is counted as dense, as the kernels compute it."""
    s, h, f = shape.seq_length, shape.hidden_size, shape.ffn_hidden_size
    layer_forward = 8 * s * h * h + 4 * s * s * h + 4 * s * h * f
    factor = 4 if checkpoint_activations else 3
    return factor * shape.num_layers * layer_forward + 3 * 2 * s * h * shape.padded_vocab_size


def gigaflos_no_embeds(samples, seq_length, parameters_no_embedding):
    """Kaplan et al.'s compute C = 6 N D, N without embeddings, D tokens; in 1e9 units."""
    return 6 * samples * seq_length * parameters_no_embedding / 1e9
