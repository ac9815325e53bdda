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


# the value rules of single flags, one wording for the trainer, tools/param_count.py and the shape
def require_positive(flag, value):
    """Sizes, counts and intervals: None (not given) or > 0."""
    require(value is None or value > 0, f"{flag} {value} must be positive")


def require_non_negative(flag, value):
    require(value is None or value >= 0, f"{flag} {value} must be >= 0")


def require_fraction(flag, value, below_one=False):
    """A probability or fraction: in [0, 1] (or [0, 1) where 1 breaks the math, as for Adam's betas)."""
    ok = value is None or (0 <= value < 1 if below_one else 0 <= value <= 1)
    require(ok, f"{flag} {value} must be in [0, {'1)' if below_one else '1]'}")


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
                      "max_position_embeddings", "make_vocab_size_divisible_by", "vocab_size",
                      "tensor_model_parallel_size", "pipeline_model_parallel_size"):
            require_positive(_flag(field), getattr(self, field))
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
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

    @classmethod
    def from_args(cls, args, vocab_size=None):
        return cls(num_layers=args.num_layers, hidden_size=args.hidden_size,
                   num_attention_heads=args.num_attention_heads, seq_length=args.seq_length,
                   vocab_size=vocab_size, ffn_hidden_size=args.ffn_hidden_size,
                   max_position_embeddings=args.max_position_embeddings,
                   make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
                   tensor_model_parallel_size=args.tensor_model_parallel_size,
                   pipeline_model_parallel_size=args.pipeline_model_parallel_size)

    @property
    def padded_vocab_size(self):
        assert self.vocab_size is not None, "the vocab size is not known yet (build the tokenizer first)"
        return pad_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, self.tensor_model_parallel_size)

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def layers_per_stage(self):
        return partition_layers(self.num_layers, self.pipeline_model_parallel_size)
