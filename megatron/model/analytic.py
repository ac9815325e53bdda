"""What a ModelShape builds, from the shape alone (torch-free): every parameter tensor with its
full shape, TP split rule, module names and pipeline placement (the parameter table), the exact
counts that follow from it, and the FLOPs formula. The pipeline placement weighs the pipe's layers
(ModelShape.pipe_layers, in order) by parameters and FLOPs (`pipe_items`) and splits them with the
rules of megatron/model/partition.py (`stage_parts`).

The table is the one description of the parameters: the build-time matcher (megatron/utils.py),
resharding (megatron/checkpoint/reshard.py) and the transformers export
(tools/convert_checkpoint_to_hf.py) find a parameter by the names `entries_by_name` gives and
cut, merge or unfuse it by its entry's split rule (`SPLIT_DIMS`, `block`, `fused_parts`).

The measured count in megatron/utils.py must equal `analytic_parameter_counts` exactly; the
trainer cross-checks the two at startup and tools/param_count.py prints this side.
"""
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from types import MappingProxyType
from typing import Any, NamedTuple

from .partition import TRANSFORMER_ITEM, PipeItem, split_items
from .shape import ModelShape, PipeLayer

COMPONENTS = ("word_embeddings", "position_embeddings", "embedding_layernorm", "attention", "mlp", "layernorm",
              "output_layer", "experts", "router")
# Kaplan et al.: "excluding all vocabulary and positional embeddings" -- the untied output layer is
# the vocabulary projection, so tied and untied variants of one model share one N; norms stay in N
EMBEDDING_COMPONENTS = ("word_embeddings", "position_embeddings", "output_layer")


# TP split rules: the dimension TP cuts (None: every TP rank holds the whole tensor); a rank's
# slice is one contiguous chunk of it, a whole number of the entry's `block`s of rows:
#   replicated  norms, position table, row-parallel biases, the router, whole (non-TP) experts
#   column      ColumnParallelLinear's output rows (and its bias)
#   row         RowParallelLinear's input columns (its bias is replicated)
#   vocab       the word embedding / output layer: rows of the padded vocab (the padded rows are
#               real logits: they stay as saved)
SPLIT_DIMS: dict[str, int | None] = {"replicated": None, "column": 0, "row": 1, "vocab": 0}
# Fused rows of a column-parallel linear (`fused`), laid out so that a TP chunk of whole blocks
# means the same on every rank:
#   qkv  one row block per kv group: its a/g query heads, then its key head and its value head
#        (block (a/g + 2) x head dim rows; with a == g, GPT-NeoX's and BLOOM's per-head q, k, v)
#   glu  a GLU's dense_h_to_4h: rows alternate gate / value (block: the pair of rows 2j, 2j+1)
FUSED_KINDS = ("qkv", "glu")


class ParamSpec(NamedTuple):
    """One parameter tensor. `layer` is its index in GPTModelPipe's layer list (0: embedding,
    1..L: transformer layers, L+1: final norm, L+2: the output layer -- the tied copy of the
    embedding, or the untied output weight), `key` its name inside that layer (its module names:
    `module_name`); `split` its TP split rule (SPLIT_DIMS), `fused` the projections its rows
    interleave (FUSED_KINDS, `fused_parts`), `block` the rows that stay together on one TP rank."""
    layer: int
    key: str
    component: str
    shape: tuple[int, ...]
    split: str = "replicated"
    fused: str | None = None
    block: int = 1

    @property
    def partition_dim(self) -> int | None:
        """The dimension TP splits (None: replicated)."""
        return SPLIT_DIMS[self.split]

    def local_numel(self, tp: int) -> int:
        return prod(self.shape) // (1 if self.partition_dim is None else tp)


def _embedding_specs(shape, layer, first_stage=True):
    """The embedding module. The embedding LayerNorm exists on the first stage only: the last
    stage's tied copy serves as the output layer and never runs it."""
    h = shape.hidden_size
    specs = [ParamSpec(layer, "word_embeddings.weight", "word_embeddings", (shape.padded_vocab_size, h), "vocab")]
    if shape.position_embedding_type == "absolute":
        specs.append(ParamSpec(layer, "position_embeddings.weight", "position_embeddings",
                               (shape.max_position_embeddings, h)))
    if shape.embed_layernorm and first_stage:
        specs += _norm_specs(layer, "embedding_layernorm.", h, "layernorm", "embedding_layernorm")
    return specs


def _norm_specs(layer, prefix, h, normalization, component="layernorm"):
    """LayerNorm: weight and bias; RMSNorm: weight only."""
    specs = [ParamSpec(layer, f"{prefix}weight", component, (h,))]
    if normalization == "layernorm":
        specs.append(ParamSpec(layer, f"{prefix}bias", component, (h,)))
    return specs


def _linear_specs(shape, layer, name, component, out_features, in_features, split, fused=None, block=1, bias=None):
    """A column-parallel linear (split column; its bias is split and fused like the weight's rows)
    or a row-parallel one (split row; its bias is replicated). bias: whether it has one (default:
    the shape's add_bias_linear)."""
    specs = [ParamSpec(layer, f"{name}.weight", component, (out_features, in_features), split, fused, block)]
    if shape.add_bias_linear if bias is None else bias:
        bias = (split, fused, block) if split == "column" else ("replicated", None, 1)
        specs.append(ParamSpec(layer, f"{name}.bias", component, (out_features,), *bias))
    return specs


def _transformer_layer_specs(shape, layer):
    h, f, norm = shape.hidden_size, shape.ffn_hidden_size, shape.normalization
    a, g, d = shape.num_attention_heads, shape.num_key_value_heads, shape.kv_channels
    return (_norm_specs(layer, "input_layernorm.", h, norm)
            # one row block per kv group: its query heads, then its key head and value head
            # (--add-qkv-bias: a bias here even without the other linears')
            + _linear_specs(shape, layer, "self_attention.query_key_value", "attention", (a + 2 * g) * d, h, "column",
                            "qkv", (a // g + 2) * d, bias=shape.qkv_bias)
            + _linear_specs(shape, layer, "self_attention.dense", "attention", h, a * d, "row")
            + _norm_specs(layer, "post_attention_layernorm.", h, norm)
            # a GLU's dense_h_to_4h yields the gate and the value: 2f outputs, alternating
            + (_linear_specs(shape, layer, "mlp.dense_h_to_4h", "mlp", 2 * f, h, "column", "glu", 2) if shape.glu
               else _linear_specs(shape, layer, "mlp.dense_h_to_4h", "mlp", f, h, "column"))
            + _linear_specs(shape, layer, "mlp.dense_4h_to_h", "mlp", h, f, "row"))


def _output_layer_specs(shape, layer):
    """The untied output layer: its own vocab-parallel weight on the last stage."""
    return [ParamSpec(layer, "weight", "output_layer", (shape.padded_vocab_size, shape.hidden_size), "vocab")]


def _transformer_layer_or_moe_specs(shape, layer):
    return moe_layer_specs(shape, layer, _transformer_layer_specs(shape, layer))


# --- mixture of experts ------------------------------------------------------------------------
# An MoE layer's MLP slot holds DeepSpeed's MoE module (megatron/model/moe.py), with its names:
# the router `deepspeed_moe.gate.wg` (h -> E, no bias), E experts, each the dense layer's MLP
# (TP-split with --enable-expert-tensor-parallelism, otherwise whole on every TP rank), and, for
# PR-MoE (--mlp-type residual), that MLP once more as `mlp.` plus the mixing coefficient
# `coefficient` (h -> 2, with bias). The table lists every expert once, by its global index; EP
# rank r holds experts [r E/EP, (r+1) E/EP) under local indices 0 .. E/EP - 1.

EXPERT_PREFIX = "mlp.deepspeed_moe.experts.deepspeed_experts."


def _dense_mlp_specs(shape):
    """The dense MLP's specs (keys without the `mlp.` prefix): what an expert is made of."""
    return [spec._replace(key=spec.key[len("mlp."):]) for spec in _transformer_layer_specs(shape, 0)
            if spec.component == "mlp"]


def _expert_specs(shape, layer, prefix, component):
    tp = shape.enable_expert_tensor_parallelism
    return [spec._replace(layer=layer, key=prefix + spec.key, component=component,
                          split=spec.split if tp else "replicated") for spec in _dense_mlp_specs(shape)]


def moe_layer_specs(shape: ModelShape, layer: int, dense_specs: list[ParamSpec]) -> list[ParamSpec]:
    """The layer's specs with its MLP replaced by an MoE when `layer` is an MoE layer."""
    num_experts = shape.experts_per_layer()[layer - 1]
    if num_experts == 1:
        return dense_specs
    h = shape.hidden_size
    specs = [spec for spec in dense_specs if spec.component != "mlp"]
    specs.append(ParamSpec(layer, "mlp.deepspeed_moe.gate.wg.weight", "router", (num_experts, h)))
    for e in range(num_experts):
        specs += _expert_specs(shape, layer, f"{EXPERT_PREFIX}{e}.", "experts")
    if shape.mlp_type == "residual":
        specs += _expert_specs(shape, layer, "mlp.mlp.", "mlp")
        specs += [ParamSpec(layer, "mlp.coefficient.weight", "router", (2, h)),
                  ParamSpec(layer, "mlp.coefficient.bias", "router", (2,))]
    return specs


def expert_parameters(shape: ModelShape) -> int:
    """Parameters of one expert (every expert has the dense MLP's shape)."""
    return sum(prod(spec.shape) for spec in _dense_mlp_specs(shape))


def expert_index(spec: ParamSpec) -> int:
    """Global expert index of an `experts` spec."""
    return int(spec.key[len(EXPERT_PREFIX):].split(".")[0])


def held_by_expert_parallel_rank(shape: ModelShape, spec: ParamSpec, ep_rank: int) -> bool:
    """Whether EP rank `ep_rank` holds `spec` (every non-expert parameter, and its own experts)."""
    if spec.component != "experts":
        return True
    per_rank = shape.experts_per_layer()[spec.layer - 1] // shape.moe_expert_parallel_size
    return expert_index(spec) // per_rank == ep_rank


def active_expert_parameters(shape: ModelShape) -> int:
    """Expert parameters one token passes through: top-k experts in every MoE layer."""
    return sum(shape.topk * expert_parameters(shape) for e in shape.experts_per_layer() if e > 1)


def experts_per_expert_parallel_rank(shape: ModelShape) -> tuple[int, int]:
    """(experts, expert parameters) that each EP rank holds, all MoE layers together (over its TP
    ranks together when the experts are TP-split)."""
    experts = sum(e // shape.moe_expert_parallel_size for e in shape.experts_per_layer() if e > 1)
    return experts, experts * expert_parameters(shape)


def mlp_forward_flops(shape: ModelShape, seq_length: int | None = None) -> list[int]:
    """Forward FLOPs of each layer's MLP slot per sample: the dense MLP (2s x its weight matrices,
    4shf) or, in an MoE layer, the top-k experts' MLPs, the router 2shE and with PR-MoE the dense
    MLP and its coefficient 2sh2. Dispatch / combine are excluded: they move tokens (and an
    expert's unused capacity slots compute nothing of the model). `seq_length`: the tokens per
    sample actually trained (a curriculum's shorter ones), default --seq-length."""
    s, h = seq_length or shape.seq_length, shape.hidden_size
    mlp = 2 * s * sum(prod(spec.shape) for spec in _dense_mlp_specs(shape) if len(spec.shape) == 2)  # 4shf
    residual = mlp + 2 * s * h * 2 if shape.mlp_type == "residual" else 0
    return [shape.topk * mlp + 2 * s * h * e + residual if e > 1 else mlp for e in shape.experts_per_layer()]


def pipe_layer_specs(shape: ModelShape, item: PipeLayer) -> list[ParamSpec]:
    """The parameters one built copy of a GPTModelPipe layer (ModelShape.pipe_layers) holds: every
    expert of an MoE layer; the tied output copy is the whole embedding module (no embedding
    LayerNorm: the last stage never runs it)."""
    if item.kind == "embedding":
        return _embedding_specs(shape, 0)
    if item.kind == "transformer":
        return _transformer_layer_or_moe_specs(shape, item.layer)
    if item.kind == "norm":
        return _norm_specs(item.layer, "", shape.hidden_size, shape.normalization)
    if item.kind == "tied_output":
        return _embedding_specs(shape, item.layer, first_stage=False)
    if item.kind == "output":
        return _output_layer_specs(shape, item.layer)
    return []  # the MoE loss function


def parameter_table(shape: ModelShape) -> list[ParamSpec]:
    """Every parameter of the model once, in the pipe's layer order (a tied output layer is the
    word embedding: its copy is not listed again)."""
    return [spec for item in shape.pipe_layers() if item.kind != "tied_output"
            for spec in pipe_layer_specs(shape, item)]


# --- names and fused parts: how resharding, the export and the build-time matcher read the table ---

def module_name(spec: ParamSpec, shape: ModelShape, pipeline: bool) -> str:
    """The entry's parameter name in GPTModelPipe (pipeline=True: `<layer>.<key>`; the tied
    embedding is DeepSpeed's `tied_modules.embed.<key>`, the same name on every stage holding a
    copy) or in GPTModel. Experts by global index."""
    layer, key, L = spec.layer, spec.key, shape.num_layers
    if pipeline:
        return f"tied_modules.embed.{key}" if layer == 0 and shape.tied else f"{layer}.{key}"
    if layer == 0:
        return f"language_model.embedding.{key}"
    if layer <= L:
        return f"language_model.encoder.layers.{layer - 1}.{key}"
    if layer == L + 1:
        return f"language_model.encoder.final_layernorm.{key}"
    return f"language_model.output_layer.{key}"


@lru_cache(maxsize=16)
def entries_by_name(shape: ModelShape, pipeline: bool) -> MappingProxyType:
    """{module name: entry} for every entry of the table (read-only: the cache shares it)."""
    return MappingProxyType({module_name(spec, shape, pipeline): spec for spec in parameter_table(shape)})


def table_entry(name: str, shape: ModelShape, pipeline: bool) -> ParamSpec | None:
    """The entry a GPTModelPipe (pipeline=True) or GPTModel parameter name describes, or None."""
    return entries_by_name(shape, pipeline).get(name)


def fused_parts(spec: ParamSpec, shape: ModelShape, full: Any) -> dict[str, Any]:
    """The separate projections in a fused entry's full tensor (rows first; any torch tensor):
    qkv -> query [a d, ...], key [g d, ...], value [g d, ...], each with its heads in order;
    glu -> gate, value (rows 2j and 2j + 1); an entry that fuses nothing -> {"": full}."""
    rest = tuple(full.shape[1:])
    if spec.fused == "qkv":
        a, g, d = shape.num_attention_heads, shape.num_key_value_heads, shape.kv_channels
        groups = full.reshape(g, a // g + 2, d, *rest)
        return {"query": groups[:, :a // g].reshape(a * d, *rest), "key": groups[:, a // g].reshape(g * d, *rest),
                "value": groups[:, a // g + 1].reshape(g * d, *rest)}
    if spec.fused == "glu":
        return {"gate": full[0::2], "value": full[1::2]}
    return {"": full}


# --- the pipeline split (the rules: megatron/model/partition.py) ------------------------------

@lru_cache(maxsize=64)
def pipe_items(shape: ModelShape) -> tuple[PipeItem, ...]:
    """GPTModelPipe's layer specs in order, as DeepSpeed sees them, weighed for the split: the
    parameters one rank builds (TP-local, EP rank 0's experts; DeepSpeed builds the tied copy as a
    whole EmbeddingPipe) and forward + backward FLOPs (a tuple: cached per shape)."""
    tp, layer_flops, logits = shape.tensor_model_parallel_size, layer_forward_flops(shape), logits_forward_flops(shape)

    def flops(item: PipeLayer) -> int:
        if item.kind == "transformer":
            return 3 * layer_flops[item.layer - 1]
        return 3 * logits if item.kind in ("tied_output", "output") else 0

    return tuple(PipeItem(item.name, item.layer, sum(spec.local_numel(tp) for spec in pipe_layer_specs(shape, item)
                                                     if held_by_expert_parallel_rank(shape, spec, 0)), flops(item))
                 for item in shape.pipe_layers())


@lru_cache(maxsize=64)
def stage_parts(shape: ModelShape) -> tuple[int, ...]:
    """The P + 1 item boundaries of the shape's pipeline split (--pp-partition-method)."""
    return split_items(pipe_items(shape), shape.pipeline_model_parallel_size, shape.pp_partition_method)


def stage_items(shape: ModelShape) -> list[list[PipeItem]]:
    """[[PipeItem]] per stage."""
    items, parts = pipe_items(shape), stage_parts(shape)
    return [list(items[parts[p]:parts[p + 1]]) for p in range(len(parts) - 1)]


def layers_per_stage(shape: ModelShape) -> list[int]:
    """Transformer layers per pipeline stage under the shape's split."""
    return [sum(item.name == TRANSFORMER_ITEM for item in items) for items in stage_items(shape)]


@lru_cache(maxsize=64)
def _stage_of_item_layer(shape: ModelShape) -> dict[int, int]:
    """{table layer index: stage} for every item with parameters (cached: the table asks per tensor)."""
    return {item.layer: stage for stage, held in enumerate(stage_items(shape)) for item in held
            if item.layer is not None}


def stage_of_layer(shape: ModelShape, layer: int) -> int:
    """Pipeline stage holding GPTModelPipe layer `layer` under the shape's split (the embedding is
    always on the first stage, the output layer on the last)."""
    return _stage_of_item_layer(shape)[layer]


def stage_parameters(shape: ModelShape, stage: int) -> list[tuple[ParamSpec, bool]]:
    """[(spec, owned)] that each TP rank of `stage` holds (of an MoE model: at EP rank 0). With
    PP > 1 and a tied output layer the last stage holds a copy of the embedding module
    (DeepSpeed's TiedLayerSpec); the first stage owns it. An untied output layer is the last
    stage's own: no copy."""
    held = [(spec, True) for spec in parameter_table(shape) if stage_of_layer(shape, spec.layer) == stage
            and held_by_expert_parallel_rank(shape, spec, 0)]
    if shape.tied and shape.pipeline_model_parallel_size > 1 and stage == shape.pipeline_model_parallel_size - 1:
        held += [(spec, False) for spec in _embedding_specs(shape, shape.num_layers + 2, first_stage=False)]
    return held


class StageCount(NamedTuple):
    layers: int  # transformer layers
    held: int    # elements held by the stage's TP rank 0 (what DeepSpeed logs as STAGE_PARAMS); MoE: at EP rank 0
    owned: int   # elements owned by the stage, all TP (and EP) ranks together


@dataclass(frozen=True)
class ParameterCounts:
    """The model's exact size: per component and per pipeline stage. `experts_active`: the
    expert parameters a token passes through (top-k per MoE layer; 0 for a dense model)."""
    components: dict
    stages: tuple
    experts_active: int = 0

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def no_embedding(self) -> int:
        return self.total - sum(self.components[c] for c in EMBEDDING_COMPONENTS)

    @property
    def active(self) -> int:
        """Parameters per token: everything but the experts, plus the top-k experts of each MoE
        layer (routers and PR-MoE's dense MLP included). Equals `total` for a dense model."""
        return self.total - self.components["experts"] + self.experts_active

    @property
    def active_no_embedding(self) -> int:
        return self.active - sum(self.components[c] for c in EMBEDDING_COMPONENTS)


def analytic_parameter_counts(shape: ModelShape) -> ParameterCounts:
    components = dict.fromkeys(COMPONENTS, 0)
    for spec in parameter_table(shape):
        components[spec.component] += prod(spec.shape)
    tp = shape.tensor_model_parallel_size
    stages = []
    for stage, layers in enumerate(layers_per_stage(shape)):
        held = stage_parameters(shape, stage)
        # owned: every parameter of the stage once (the table's), all TP and EP ranks together
        owned = sum(prod(spec.shape) for spec in parameter_table(shape) if stage_of_layer(shape, spec.layer) == stage)
        stages.append(StageCount(layers, sum(spec.local_numel(tp) for spec, _ in held), owned))
    return ParameterCounts(components, tuple(stages), active_expert_parameters(shape))


# --- FLOPs -----------------------------------------------------------------------------------

def recomputed_layers(shape: ModelShape, method: str | None, num_layers: int) -> list[int]:
    """0-based indices of the transformer layers that activation checkpointing runs forward a second
    time in backward. uniform (chunks of `num_layers`): every layer, each chunk once; block: the
    first `num_layers` layers of each pipeline stage (Megatron's `--activations-checkpoint-method`)."""
    if method is None:
        return []
    if method == "uniform":
        return list(range(shape.num_layers))
    layers: list[int] = []
    first = 0
    for stage_layers in layers_per_stage(shape):
        layers += range(first, first + min(num_layers, stage_layers))
        first += stage_layers
    return layers


def flops_per_sample(shape: ModelShape, checkpoint_activations: bool, method: str | None = None,
                     num_layers: int = 1, seq_length: int | None = None, causal: bool = False) -> int:
    """Model FLOPs of one training sample (forward + backward), Narayanan et al. 2021 eq. 3
    generalised per component (a query heads, g key/value heads, head dim d, ffn size f). Per
    layer, forward: QKV 2sh(ad + 2gd), attention scores and context 2 x 2s^2 ad, output
    projection 2s ad h, MLP 4shf (6shf with a GLU: dense_h_to_4h yields 2f; an MoE layer's MLP
    slot as `mlp_forward_flops` says: top-k experts, router). Backward costs twice the forward;
    activation recomputation adds one more forward of each recomputed layer (factor 4 instead of
    3 for all of them with the uniform method, the default of `checkpoint_activations=True`; for
    the first `num_layers` of each stage with method "block"). The logit layer 2shV, tied or not,
    is never recomputed (factor 3). Elementwise work (norms, activations, softmax, biases, rotary,
    ALiBi) is ignored and causal attention is counted as dense, as the kernels compute it and both
    forks count it; `causal=True` halves the attention's s^2 terms (scores and context) for the causal
    mask, as Megatron-LM counts them (--flops-attention causal; FLOPS_CONVENTIONS).
    `seq_length`: a sample of that many tokens (a curriculum's shorter ones; the model's pipeline
    split and its recomputed layers stay those of the shape), default the shape's --seq-length."""
    per_layer = layer_forward_flops(shape, seq_length, causal)
    method = (method or "uniform") if checkpoint_activations else None
    recompute = sum(per_layer[i] for i in recomputed_layers(shape, method, num_layers))
    return 3 * sum(per_layer) + recompute + 3 * logits_forward_flops(shape, seq_length)


# what a FLOPs number counts of attention's s^2 terms: --flops-attention's values, said wherever one is shown
FLOPS_CONVENTIONS = {
    "full": "attention's s^2 terms in full (as both Megatron-DeepSpeed forks count them; "
            "--flops-attention causal halves them as Megatron-LM does)",
    "causal": "attention's s^2 terms halved for the causal mask (Megatron-LM's count, --flops-attention causal; "
              "both Megatron-DeepSpeed forks count them in full)",
}


def flops_convention_line(causal: bool) -> str:
    return "FLOPs convention: " + FLOPS_CONVENTIONS["causal" if causal else "full"]


def layer_forward_flops(shape: ModelShape, seq_length: int | None = None, causal: bool = False) -> list[int]:
    """Forward FLOPs per sample of each transformer layer (see flops_per_sample)."""
    s, h = seq_length or shape.seq_length, shape.hidden_size
    a, g, d = shape.num_attention_heads, shape.num_key_value_heads, shape.kv_channels
    qkv = 2 * s * h * (a * d + 2 * g * d)
    attention = 4 * s * s * a * d // (2 if causal else 1)
    projection = 2 * s * a * d * h
    return [qkv + attention + projection + mlp for mlp in mlp_forward_flops(shape, s)]


def logits_forward_flops(shape: ModelShape, seq_length: int | None = None) -> int:
    """The output layer's 2shV per sample (tied or not)."""
    return 2 * (seq_length or shape.seq_length) * shape.hidden_size * shape.padded_vocab_size


def gigaflos_no_embeds(samples: int, seq_length: int, parameters_no_embedding: int) -> float:
    """Kaplan et al.'s compute C = 6 N D, N without embeddings, D tokens; in 1e9 units. For MoE,
    N is the active count (parameters a token passes through), as the trainer passes it."""
    return 6 * samples * seq_length * parameters_no_embedding / 1e9
