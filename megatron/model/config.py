"""What the layers are built from: the model's shape (megatron/model/shape.py, the one owner of
its defaults and rules) plus the numerics that do not change its size. Passed explicitly to
every layer (layers never read args)."""
import math
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from megatron.runtime.precision import softmax_in_fp32

from .moe.options import MoEOptions
from .shape import ModelShape


@dataclass(frozen=True)
class GPTConfig:
    shape: ModelShape
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    word_embedding_init_std: float | None = None  # Argonne's --word-embedding-init-std; None: init_method_std
    layernorm_epsilon: float = 1e-5
    params_dtype: torch.dtype = torch.float32
    checkpoint_activations: bool = False
    checkpoint_num_layers: int = 1
    checkpoint_method: str = "uniform"  # uniform: chunks of checkpoint_num_layers; block: the first ones of a stage
    attention_impl: str = "sdpa"  # "math" spells attention out as matmuls (FLOP-countable)
    rope_theta: float = 10000.0   # rotary base (--rotary-position-embeddings-theta)
    moe: MoEOptions = MoEOptions()  # capacity, loss coefficient, ... of the MoE layers (if any)
    # --sequence-parallel (TP > 1 only; validation turns it off at TP 1): norms, dropouts and
    # residuals on sequence shards [s/tp, b, h]; the same math
    sequence_parallel: bool = False
    # --reset-position-ids / --reset-attention-mask: positions restart, and attention stops, at each
    # end-of-document token of a sample (megatron/model/documents.py)
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    init_method_xavier_uniform: bool = False  # every weight matrix drawn as torch's xavier_uniform_ (the forks')
    # --fp32-residual-connection (--fp16 / --bf16 only): the residual stream in fp32
    fp32_residual_connection: bool = False
    # the attention softmax in fp32 (False: in the activations' dtype, Megatron's unfused softmax)
    attention_softmax_in_fp32: bool = True

    @classmethod
    def from_args(cls, args: Namespace) -> "GPTConfig":
        return cls(shape=args.model_shape, hidden_dropout=args.hidden_dropout,
                   attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
                   word_embedding_init_std=word_embedding_init_std(args),
                   layernorm_epsilon=args.layernorm_epsilon, params_dtype=args.params_dtype,
                   checkpoint_activations=args.checkpoint_activations,
                   checkpoint_num_layers=args.checkpoint_num_layers,
                   checkpoint_method=args.activations_checkpoint_method or "uniform",
                   attention_impl=args.attention_impl, rope_theta=args.rope_theta, moe=MoEOptions.from_args(args),
                   sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
                   reset_position_ids=bool(getattr(args, "reset_position_ids", False)),
                   reset_attention_mask=bool(getattr(args, "reset_attention_mask", False)),
                   init_method_xavier_uniform=getattr(args, "init_method_xavier_uniform", False),
                   fp32_residual_connection=getattr(args, "fp32_residual_connection", False),
                   attention_softmax_in_fp32=softmax_in_fp32(args))

    def init_method(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Every weight matrix not named below: N(0, init_method_std), or --init-method-xavier-uniform's
        U(-b, b), b = sqrt(6 / (fan_in + fan_out)) of the whole matrix (the TP layers initialise the
        full weight and slice it, as the forks with --use-cpu-initialization)."""
        if self.init_method_xavier_uniform:
            return nn.init.xavier_uniform_
        std = self.init_method_std
        return lambda w: nn.init.normal_(w, mean=0.0, std=std)

    def word_embedding_init_method(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The word embedding's (and so a tied output layer's): N(0, word_embedding_init_std), else
        init_method's (the forks draw it with the init method)."""
        if self.word_embedding_init_std is None:
            return self.init_method()
        std = self.word_embedding_init_std
        return lambda w: nn.init.normal_(w, mean=0.0, std=std)

    def output_init_method(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Projections that write into the residual stream: std / sqrt(2 * layers) (GPT-2); with
        --init-method-xavier-uniform xavier as every other matrix (the fork sets both to it)."""
        if self.init_method_xavier_uniform:
            return nn.init.xavier_uniform_
        std = self.init_method_std / math.sqrt(2.0 * self.shape.num_layers)
        return lambda w: nn.init.normal_(w, mean=0.0, std=std)


def word_embedding_init_std(args: Namespace) -> float | None:
    """Argonne's rule: --adjust-word-embedding-init gives the word embedding N(0, --word-embedding-init-std),
    0.02 when that is not given (the fork's default, whatever --init-method-std is); without it, None
    (--init-method-std, as every other weight)."""
    if not getattr(args, "adjust_word_embedding_init", False):
        return None
    return 0.02 if args.word_embedding_init_std is None else args.word_embedding_init_std
