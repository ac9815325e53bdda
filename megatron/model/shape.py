"""The model's shape: the one owner of its defaults (ffn size, kv heads, head dim, position table,
padded vocab), of its architecture variant, and of the rules that make a shape buildable at a
TP x PP layout. Torch-free: the trainer's
arguments, the model, the parameter count, the FLOPs formula and tools/param_count.py all read
a ModelShape, so no default or divisibility rule is written twice."""
import re
from argparse import Namespace
from dataclasses import dataclass
from typing import NamedTuple

from megatron.runtime.refusal import require, require_positive


def pad_vocab_size(orig_vocab_size: int, make_vocab_size_divisible_by: int, tensor_model_parallel_size: int) -> int:
    """Megatron pads the vocab so that each TP rank's slice is a multiple of the divisor."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return ((orig_vocab_size + multiple - 1) // multiple) * multiple


def moe_fields_from_args(args: Namespace) -> dict:
    """The MoE flags (megatron/config/arguments.py: _add_moe_args); absent ones keep the dense defaults."""
    names = ("num_experts", "expert_interval", "topk", "moe_expert_parallel_size", "mlp_type",
             "enable_expert_tensor_parallelism")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _flag(field):
    return "--" + field.replace("_", "-")


POSITION_EMBEDDING_TYPES = ("absolute", "rotary", "alibi", "none")
# Megatron-LM's spellings of the same choices
POSITION_EMBEDDING_ALIASES = {"learned_absolute": "absolute", "rope": "rotary"}
GLU_ACTIVATIONS = ("geglu", "liglu", "reglu", "swiglu")
# the non-gated MLP's activation: gelu (erf, the default), --openai-gelu (the tanh approximation,
# GPT-2's original), --squared-relu (relu(x)^2, Primer)
ACTIVATIONS = ("gelu", "openai_gelu", "squared_relu")
NORMALIZATIONS = ("layernorm", "rmsnorm")


def swiglu_ffn_hidden_size(hidden_size: int) -> int:
    """Microsoft Megatron-DeepSpeed's --swiglu default, int((4 h * 2 / 3) / 64) * 64: two thirds
    of 4h (the GLU has a third matrix), rounded down to a multiple of 64. Integer arithmetic
    gives the same floor: 8h/3 is never within rounding error of a multiple of 64 unless it is one."""
    return (8 * hidden_size) // (3 * 64) * 64


# --pp-partition-method: ours (balanced by FLOPs) and DeepSpeed's (megatron/model/partition.py)
DEFAULT_METHOD = "type:transformer"  # what an absent --pp-partition-method means (both forks)
FLOPS_METHOD = "flops"  # ours: balanced by cost
DEEPSPEED_METHODS = ("uniform", "parameters", "type:REGEX")
TRANSFORMER_ITEM = "ParallelTransformerLayerPipe"


class PipeLayer(NamedTuple):
    """One entry of GPTModelPipe's layer list (ModelShape.pipe_layers)."""
    name: str          # the class (function) name DeepSpeed's type:REGEX matches
    kind: str          # embedding, transformer, moe_loss, norm, tied_output or output
    layer: int | None  # the parameter table's layer index (None: the MoE loss function, no parameters)


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int | None = None              # the tokenizer's, unpadded; None until it is known
    ffn_hidden_size: int | None = None         # default 4 x hidden size (--swiglu: swiglu_ffn_hidden_size)
    max_position_embeddings: int | None = None  # default seq length; bounds the sequence with any positions
    make_vocab_size_divisible_by: int = 128
    pad_vocab_size_to: int | None = None       # BigScience's --pad-vocab-size-to: exactly this many rows
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    # which stage holds which layer (megatron/model/partition.py); None: type:transformer (the forks')
    pp_partition_method: str | None = None
    # architecture variants (GPT-2 when left at their defaults)
    position_embedding_type: str = "absolute"  # absolute (learned table), rotary, alibi, none
    rotary_percent: float = 1.0                # rotary on the first int(head dim x this) channels of a head
    glu_activation: str | None = None          # None: GeLU MLP; else dense_h_to_4h has 2 x ffn outputs
    swiglu: bool = False                       # --swiglu: glu_activation swiglu, and its ffn default
    normalization: str = "layernorm"           # or rmsnorm (weight only)
    embed_layernorm: bool = False              # a LayerNorm after the word embedding (first stage)
    add_bias_linear: bool = True               # False: no bias in QKV, dense, and the MLP linears
    add_qkv_bias: bool = False                 # Megatron-LM's: the QKV bias even without add_bias_linear
    num_key_value_heads: int | None = None     # default num_attention_heads (MHA); 1: MQA
    kv_channels: int | None = None             # head dim; default hidden size / heads
    untie_embeddings_and_output_weights: bool = False
    activation: str = "gelu"                   # ACTIVATIONS; a GLU's activation is glu_activation's
    # --apply-residual-connection-post-layernorm: the residuals add the norms' outputs (original BERT)
    apply_residual_connection_post_layernorm: bool = False
    # --apply-layernorm-1p: every norm's weight stores gamma - 1 (initialised to 0); same parameters
    apply_layernorm_1p: bool = False
    # --- mixture of experts (DeepSpeed-MoE, Megatron-DeepSpeed's flags); defaults: dense ---
    num_experts: tuple[int, ...] = (1,)  # one value, or one per MoE layer (num_layers // expert_interval)
    expert_interval: int = 2             # layer l (1-based) is an MoE layer when l % expert_interval == 0
    topk: int = 1
    moe_expert_parallel_size: int = 1
    mlp_type: str = "standard"           # "residual": PR-MoE, a dense MLP next to the experts
    enable_expert_tensor_parallelism: bool = False

    def __post_init__(self):
        for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
            require(getattr(self, field) is not None, f"{_flag(field)} is required")
            require(getattr(self, field) > 0, f"{_flag(field)} {getattr(self, field)} must be positive")
        position = POSITION_EMBEDDING_ALIASES.get(self.position_embedding_type, self.position_embedding_type)
        require(position in POSITION_EMBEDDING_TYPES,
                f"--position-embedding-type {self.position_embedding_type}: choose absolute, rotary or alibi")
        object.__setattr__(self, "position_embedding_type", position)
        if self.swiglu:
            require(self.glu_activation in (None, "swiglu"),
                    f"--swiglu contradicts --glu-activation {self.glu_activation}: drop one of them")
            object.__setattr__(self, "glu_activation", "swiglu")
        require(self.glu_activation in (None,) + GLU_ACTIVATIONS,
                f"--glu-activation {self.glu_activation}: choose one of {', '.join(GLU_ACTIVATIONS)}")
        if self.add_bias_linear:  # the QKV has its bias anyway: one spelling of one model (checkpoints)
            object.__setattr__(self, "add_qkv_bias", False)
        require(self.activation in ACTIVATIONS, f"activation {self.activation}: choose one of {', '.join(ACTIVATIONS)}")
        require(self.activation == "gelu" or self.glu_activation is None,
                f"--{self.activation.replace('_', '-')} contradicts --glu-activation {self.glu_activation} "
                f"(--swiglu): a GLU has its own activation; drop one of them")
        normalization = str(self.normalization).lower()  # Megatron-LM spells it RMSNorm / LayerNorm
        require(normalization in NORMALIZATIONS, f"--normalization {self.normalization}: choose layernorm or rmsnorm")
        object.__setattr__(self, "normalization", normalization)
        if self.ffn_hidden_size is None:
            if self.swiglu:
                ffn = swiglu_ffn_hidden_size(self.hidden_size)
                require(ffn > 0, f"--swiglu: the default ffn size int(8 x --hidden-size {self.hidden_size} / 3 / 64) "
                                 f"x 64 is 0; pass --ffn-hidden-size")
            else:
                ffn = 4 * self.hidden_size
            object.__setattr__(self, "ffn_hidden_size", ffn)
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.kv_channels is None:
            require(self.hidden_size % self.num_attention_heads == 0,
                    f"--hidden-size {self.hidden_size} is not divisible by --num-attention-heads "
                    f"{self.num_attention_heads}: choose heads that divide the hidden size, or give --kv-channels")
            object.__setattr__(self, "kv_channels", self.hidden_size // self.num_attention_heads)
        self._validate()

    def _validate(self):
        for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "ffn_hidden_size",
                      "max_position_embeddings", "make_vocab_size_divisible_by", "num_key_value_heads",
                      "kv_channels", "vocab_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"):
            require_positive(_flag(field), getattr(self, field))
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        require(self.num_attention_heads % tp == 0,
                f"--num-attention-heads {self.num_attention_heads} is not divisible by "
                f"--tensor-model-parallel-size {tp}: use a TP size that divides the head count")
        a, g = self.num_attention_heads, self.num_key_value_heads
        require(a % g == 0, f"--num-key-value-heads {g} does not divide --num-attention-heads {a}: "
                            f"every key/value head serves the same number of query heads")
        # kv heads are split over TP like the query heads: each rank holds whole groups
        require(g % tp == 0, f"--num-key-value-heads {g} is not divisible by --tensor-model-parallel-size {tp}: "
                             f"use a TP size that divides the key/value head count (multi-query attention needs TP=1)")
        require(self.position_embedding_type != "rotary" or self.kv_channels % 2 == 0,
                f"--kv-channels {self.kv_channels} is odd: rotary embeddings rotate pairs of channels")
        require(0 < self.rotary_percent <= 1, f"--rotary-percent {self.rotary_percent} must be in (0, 1]")
        if self.position_embedding_type == "rotary":
            rd = self.rotary_dim
            require(rd > 0 and rd % 2 == 0,
                    f"--rotary-percent {self.rotary_percent} of head dim {self.kv_channels} gives {rd} rotary "
                    f"channels: rotary rotates pairs of channels, so int(head dim x p) must be even and > 0")
        self._validate_pad_vocab()
        require(self.ffn_hidden_size % tp == 0,
                f"--ffn-hidden-size {self.ffn_hidden_size} is not divisible by --tensor-model-parallel-size {tp}")
        require(self.num_layers >= pp,
                f"--num-layers {self.num_layers} is smaller than --pipeline-model-parallel-size {pp}: "
                f"every pipeline stage needs at least one transformer layer; lower PP or add layers")
        require(self.seq_length <= self.max_position_embeddings,
                f"--seq-length {self.seq_length} exceeds --max-position-embeddings "
                f"{self.max_position_embeddings}: raise --max-position-embeddings or shorten the sequence")
        self._validate_moe()
        if self.vocab_size is not None:  # the split weighs the output layer: known once the vocab is
            error = self._partition_method_error()
            require(error is None, error)

    def _partition_method_error(self) -> str | None:
        """One line naming --pp-partition-method and the fix, or None when the method applies
        (the methods: megatron/model/partition.py)."""
        method = self.pp_partition_method
        choices = f"use {DEFAULT_METHOD} (the default), {FLOPS_METHOD}, {', '.join(DEEPSPEED_METHODS)}"
        if method is None or method.lower() in (FLOPS_METHOD, "uniform"):
            return None
        lower = method.lower()
        if lower == "parameters":
            if self.embed_layernorm and self.pipeline_model_parallel_size > 1:
                # DeepSpeed counts each layer on every rank, and only first-stage ranks build the
                # embedding LayerNorm: the ranks would disagree on the split
                return ("--pp-partition-method parameters with --embed-layernorm at PP > 1 splits differently on "
                        "different stages in DeepSpeed; use flops or type:transformer|embedding")
            return None
        if lower.startswith("type:"):
            pattern = method.split(":")[1]
            try:
                regex = re.compile(pattern, re.IGNORECASE)
            except re.error as e:
                return f"--pp-partition-method {method}: not a regular expression ({e})"
            names = sorted({layer.name for layer in self.pipe_layers()})
            if not any(regex.search(name) for name in names):
                return f"--pp-partition-method {method} matches none of the layers ({', '.join(names)}); {choices}"
            return None
        return f"--pp-partition-method {method} is unknown; {choices}"

    def _validate_pad_vocab(self):
        """BigScience's rule (its tokenizer.py) plus the TP split that VocabParallelEmbedding needs."""
        n = self.pad_vocab_size_to
        if n is None:
            return
        require_positive("--pad-vocab-size-to", n)
        require(n % self.make_vocab_size_divisible_by == 0,
                f"--pad-vocab-size-to {n} is not divisible by --make-vocab-size-divisible-by "
                f"{self.make_vocab_size_divisible_by}: choose a multiple of it")
        tp = self.tensor_model_parallel_size
        require(n % tp == 0, f"--pad-vocab-size-to {n} is not divisible by --tensor-model-parallel-size {tp}: "
                             f"every TP rank holds the same number of vocab rows")
        require(self.vocab_size is None or n >= self.vocab_size,
                f"--pad-vocab-size-to {n} is below the tokenizer's {self.vocab_size} tokens: pad to at least that")

    def _validate_moe(self):
        object.__setattr__(self, "num_experts", tuple(self.num_experts))
        require(self.expert_interval >= 1, f"--expert-interval {self.expert_interval} must be >= 1")
        moe_layers = self.num_layers // self.expert_interval
        require(len(self.num_experts) in (1, moe_layers),
                f"--num-experts takes one value or one per MoE layer ({moe_layers} with --num-layers "
                f"{self.num_layers} --expert-interval {self.expert_interval}); got {len(self.num_experts)}")
        require(all(e >= 1 for e in self.num_experts), f"--num-experts {list(self.num_experts)} must be >= 1")
        ep = self.moe_expert_parallel_size
        require(ep >= 1, f"--moe-expert-parallel-size {ep} must be >= 1")
        require(self.mlp_type in ("standard", "residual"), f"--mlp-type {self.mlp_type}: use standard or residual")
        require(self.topk >= 1, f"--topk {self.topk} must be >= 1")
        experts = [e for e in self.experts_per_layer() if e > 1]
        for e in experts:
            require(e % ep == 0, f"--num-experts {e} is not divisible by --moe-expert-parallel-size {ep}: "
                                 f"every expert-parallel rank holds the same number of experts")
            require(self.topk <= e, f"--topk {self.topk} exceeds --num-experts {e}")
        require(experts or ep == 1, f"--moe-expert-parallel-size {ep} needs MoE layers (--num-experts > 1)")

    def experts_per_layer(self) -> list[int]:
        """Experts of each transformer layer (1: dense MLP), Megatron-DeepSpeed's rule: layer l
        (1-based) is an MoE layer when l % expert_interval == 0, and MoE layer j (0-based) takes
        num_experts[j] (a single value applies to every MoE layer)."""
        per_moe_layer = self.num_experts * (self.num_layers // self.expert_interval) \
            if len(self.num_experts) == 1 else self.num_experts
        return [per_moe_layer[(layer - 1) // self.expert_interval] if layer % self.expert_interval == 0 else 1
                for layer in range(1, self.num_layers + 1)]

    @property
    def is_moe(self) -> bool:
        return any(e > 1 for e in self.experts_per_layer())

    @classmethod
    def from_args(cls, args: Namespace, vocab_size: int | None = None) -> "ModelShape":
        """Megatron flags (both forks' spellings, see arguments.py) -> a shape."""
        return cls(num_layers=args.num_layers, hidden_size=args.hidden_size,
                   num_attention_heads=args.num_attention_heads, seq_length=args.seq_length,
                   vocab_size=vocab_size, ffn_hidden_size=args.ffn_hidden_size,
                   max_position_embeddings=args.max_position_embeddings,
                   make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
                   pad_vocab_size_to=getattr(args, "pad_vocab_size_to", None),
                   tensor_model_parallel_size=args.tensor_model_parallel_size,
                   pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                   pp_partition_method=getattr(args, "pp_partition_method", None),
                   position_embedding_type=_position_embedding_type(args),
                   rotary_percent=getattr(args, "rotary_percent", 1.0),
                   glu_activation=args.glu_activation, swiglu=args.swiglu, normalization=args.normalization,
                   embed_layernorm=args.embed_layernorm, add_bias_linear=args.add_bias_linear,
                   add_qkv_bias=getattr(args, "add_qkv_bias", False),
                   num_key_value_heads=_num_key_value_heads(args), kv_channels=args.kv_channels,
                   untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
                   activation=_activation(args),
                   apply_residual_connection_post_layernorm=getattr(args, "apply_residual_connection_post_layernorm",
                                                                    False),
                   apply_layernorm_1p=getattr(args, "apply_layernorm_1p", False),
                   **moe_fields_from_args(args))

    @property
    def padded_vocab_size(self) -> int:
        assert self.vocab_size is not None, "the vocab size is not known yet (build the tokenizer first)"
        if self.pad_vocab_size_to is not None:
            return self.pad_vocab_size_to
        return pad_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, self.tensor_model_parallel_size)

    @property
    def head_dim(self) -> int:
        return self.kv_channels

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that rotary rotates (Microsoft's --rotary-percent: int(d x p)); the
        rest pass through unrotated."""
        return int(self.kv_channels * self.rotary_percent)

    @property
    def qkv_bias(self) -> bool:
        """Whether the fused QKV projection has a bias (Megatron-LM: add_bias_linear or add_qkv_bias)."""
        return self.add_bias_linear or self.add_qkv_bias

    @property
    def glu(self) -> bool:
        return self.glu_activation is not None

    @property
    def tied(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def pipe_layers(self) -> tuple["PipeLayer", ...]:
        """GPTModelPipe's layer list in order, the one description of it: GPTModelPipe builds one
        DeepSpeed layer spec per entry, the analytic side (megatron/model/analytic.py: pipe_items)
        weighs each for the pipeline split. 0: the embedding, 1..L: the transformer layers, (an MoE
        model: `take`, no parameters), L+1: the final norm, L+2: the output layer (the tied copy of
        the embedding module, or the untied OutputLayer). `layer` is the parameter table's index."""
        L = self.num_layers
        layers = [PipeLayer("EmbeddingPipe", "embedding", 0)]
        layers += [PipeLayer(TRANSFORMER_ITEM, "transformer", i) for i in range(1, L + 1)]
        if self.is_moe:
            layers.append(PipeLayer("take", "moe_loss", None))  # gpt_model.take
        layers.append(PipeLayer("RMSNorm" if self.normalization == "rmsnorm" else "LayerNorm", "norm", L + 1))
        layers.append(PipeLayer("EmbeddingPipe", "tied_output", L + 2) if self.tied
                      else PipeLayer("OutputLayer", "output", L + 2))
        return tuple(layers)

    def variant(self) -> dict:
        """What, besides the sizes, decides which tensors the model has (checkpoint layouts)."""
        return {field: getattr(self, field) for field in VARIANT_FIELDS}

    def describe(self) -> str:
        """One line naming the variant, e.g. "rotary, swiglu ffn 320, rmsnorm, 8 query / 2 kv heads,
        untied, no bias"."""
        positions = {"absolute": "learned positions", "none": "no positions"}.get(self.position_embedding_type,
                                                                                  self.position_embedding_type)
        if self.position_embedding_type == "rotary" and self.rotary_percent != 1:
            positions += f" on {self.rotary_dim} of {self.kv_channels} channels"
        a, g = self.num_attention_heads, self.num_key_value_heads
        heads = f"{a} heads" if g == a else f"{a} query / {g} kv heads"
        if self.kv_channels * a != self.hidden_size:
            heads += f" of dim {self.kv_channels}"
        parts = [positions, f"{self.glu_activation or self.activation} ffn {self.ffn_hidden_size}"]
        parts += ["embed layernorm"] if self.embed_layernorm else []
        parts += [self.normalization + (" 1p" if self.apply_layernorm_1p else "")]
        parts += ["post-norm residuals"] if self.apply_residual_connection_post_layernorm else []
        parts += [heads, "tied" if self.tied else "untied"]
        parts += [] if self.add_bias_linear else ["qkv bias only" if self.add_qkv_bias else "no bias"]
        return ", ".join(parts)


VARIANT_FIELDS = ("position_embedding_type", "rotary_percent", "glu_activation", "normalization", "embed_layernorm",
                  "add_bias_linear", "add_qkv_bias", "num_key_value_heads", "kv_channels",
                  "untie_embeddings_and_output_weights", "activation", "apply_residual_connection_post_layernorm",
                  "apply_layernorm_1p")


def gpt2_variant(num_attention_heads: int, hidden_size: int) -> dict:
    """The variant of a GPT-2 shape (what a checkpoint written before variants existed holds)."""
    return ModelShape(num_layers=1, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                      seq_length=1).variant()


def _position_embedding_type(args):
    """BigScience's --position-embedding-type, or the Microsoft fork's
    --use-rotary-position-embeddings / --no-position-embedding (which drops the learned table)."""
    explicit = args.position_embedding_type
    if explicit is not None:
        explicit = POSITION_EMBEDDING_ALIASES.get(explicit, explicit)
    if args.use_rotary_position_embeddings:
        require(explicit in (None, "rotary"), f"--use-rotary-position-embeddings contradicts "
                                              f"--position-embedding-type {args.position_embedding_type}; drop one")
        return "rotary"
    if not args.add_position_embedding:
        require(explicit != "absolute", "--no-position-embedding contradicts --position-embedding-type "
                                        f"{args.position_embedding_type}; drop one")
        return explicit or "none"
    return explicit or "absolute"


def _activation(args):
    """--openai-gelu / --squared-relu (both forks and Megatron-LM; at most one of them)."""
    chosen = [name for name in ACTIVATIONS[1:] if getattr(args, name, False)]
    require(len(chosen) <= 1, "--openai-gelu contradicts --squared-relu: choose one activation")
    return chosen[0] if chosen else "gelu"


def _num_key_value_heads(args):
    """--num-key-value-heads N (Microsoft's fork), or --group-query-attention --num-query-groups N
    (Megatron-LM's; N defaults to 1 there, i.e. multi-query attention)."""
    groups = None
    if args.group_query_attention:
        groups = 1 if args.num_query_groups is None else args.num_query_groups
    else:
        require(args.num_query_groups is None, "--num-query-groups needs --group-query-attention")
    if args.num_key_value_heads is not None and groups is not None:
        require(args.num_key_value_heads == groups,
                f"--num-key-value-heads {args.num_key_value_heads} contradicts --num-query-groups {groups}; drop one")
    return args.num_key_value_heads if args.num_key_value_heads is not None else groups
