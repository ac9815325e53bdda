"""The model's shape: the one owner of its defaults (ffn size, position table, padded vocab) and
of the rules that make a shape buildable at a TP x PP layout. Torch-free: the trainer's
arguments, the model, the parameter count, the FLOPs formula and tools/param_count.py all read
a ModelShape, so no default or divisibility rule is written twice."""
from dataclasses import dataclass


class ConfigError(ValueError):
    """A bad flag combination. Its message is one line naming the flag and the fix."""


def require(cond, message):
    if not cond:
        raise ConfigError(message)


def pad_vocab_size(orig_vocab_size, make_vocab_size_divisible_by, tensor_model_parallel_size):
    """Megatron pads the vocab so that each TP rank's slice is a multiple of the divisor."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return ((orig_vocab_size + multiple - 1) // multiple) * multiple


def partition_layers(num_layers, num_stages):
    """Transformer layers per pipeline stage: as even as possible, earlier stages take the
    remainder. This is how DeepSpeed's `type:transformer` partitioning splits GPTModelPipe;
    the startup cross-check compares it with the stages actually built."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if stage < extra else 0) for stage in range(num_stages)]


def moe_fields_from_args(args):
    """The MoE flags (megatron/arguments.py: _add_moe_args); absent ones keep the dense defaults."""
    names = ("num_experts", "expert_interval", "topk", "moe_expert_parallel_size", "mlp_type",
             "enable_expert_tensor_parallelism")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _flag(field):
    return "--" + field.replace("_", "-")


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int = None               # the tokenizer's, unpadded; None until it is known
    ffn_hidden_size: int = None          # default 4 x hidden size
    max_position_embeddings: int = None  # default seq length
    make_vocab_size_divisible_by: int = 128
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    # --- mixture of experts (DeepSpeed-MoE, Megatron-DeepSpeed's flags); defaults: dense ---
    num_experts: tuple = (1,)            # one value, or one per MoE layer (num_layers // expert_interval)
    expert_interval: int = 2             # layer l (1-based) is an MoE layer when l % expert_interval == 0
    topk: int = 1
    moe_expert_parallel_size: int = 1
    mlp_type: str = "standard"           # "residual": PR-MoE, a dense MLP next to the experts
    enable_expert_tensor_parallelism: bool = False

    def __post_init__(self):
        for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
            require(getattr(self, field) is not None, f"{_flag(field)} is required")
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        self._validate()

    def _validate(self):
        for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "ffn_hidden_size",
                      "max_position_embeddings", "make_vocab_size_divisible_by"):
            value = getattr(self, field)
            require(value > 0, f"{_flag(field)} {value} must be a positive integer")
        require(self.vocab_size is None or self.vocab_size > 0, f"--vocab-size {self.vocab_size} must be positive")
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        require(tp >= 1 and pp >= 1, "--tensor-model-parallel-size and --pipeline-model-parallel-size must be >= 1")
        require(self.num_attention_heads % tp == 0,
                f"--num-attention-heads {self.num_attention_heads} is not divisible by "
                f"--tensor-model-parallel-size {tp}: use a TP size that divides the head count")
        require(self.hidden_size % self.num_attention_heads == 0,
                f"--hidden-size {self.hidden_size} is not divisible by --num-attention-heads "
                f"{self.num_attention_heads}: choose heads that divide the hidden size")
        require(self.ffn_hidden_size % tp == 0,
                f"--ffn-hidden-size {self.ffn_hidden_size} is not divisible by --tensor-model-parallel-size {tp}")
        require(self.num_layers >= pp,
                f"--num-layers {self.num_layers} is smaller than --pipeline-model-parallel-size {pp}: "
                f"every pipeline stage needs at least one transformer layer; lower PP or add layers")
        require(self.seq_length <= self.max_position_embeddings,
                f"--seq-length {self.seq_length} exceeds --max-position-embeddings "
                f"{self.max_position_embeddings}: raise --max-position-embeddings or shorten the sequence")
        self._validate_moe()

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

    def experts_per_layer(self):
        """Experts of each transformer layer (1: dense MLP), Megatron-DeepSpeed's rule: layer l
        (1-based) is an MoE layer when l % expert_interval == 0, and MoE layer j (0-based) takes
        num_experts[j] (a single value applies to every MoE layer)."""
        per_moe_layer = self.num_experts * (self.num_layers // self.expert_interval) \
            if len(self.num_experts) == 1 else self.num_experts
        return [per_moe_layer[(layer - 1) // self.expert_interval] if layer % self.expert_interval == 0 else 1
                for layer in range(1, self.num_layers + 1)]

    @property
    def is_moe(self):
        return any(e > 1 for e in self.experts_per_layer())

    @classmethod
    def from_args(cls, args, vocab_size=None):
        return cls(num_layers=args.num_layers, hidden_size=args.hidden_size,
                   num_attention_heads=args.num_attention_heads, seq_length=args.seq_length,
                   vocab_size=vocab_size, ffn_hidden_size=args.ffn_hidden_size,
                   max_position_embeddings=args.max_position_embeddings,
                   make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
                   tensor_model_parallel_size=args.tensor_model_parallel_size,
                   pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                   **moe_fields_from_args(args))

    @property
    def padded_vocab_size(self):
        assert self.vocab_size is not None, "the vocab size is not known yet (build the tokenizer first)"
        return pad_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, self.tensor_model_parallel_size)

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def layers_per_stage(self):
        return partition_layers(self.num_layers, self.pipeline_model_parallel_size)
