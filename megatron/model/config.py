"""The model's shape and numerics, passed explicitly to every layer (layers never read args)."""
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    padded_vocab_size: int
    max_position_embeddings: int
    ffn_hidden_size: int = None  # default 4 * hidden_size
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    layernorm_epsilon: float = 1e-5
    params_dtype: torch.dtype = torch.float32
    checkpoint_activations: bool = False
    checkpoint_num_layers: int = 1
    attention_impl: str = "sdpa"  # "math" spells attention out as matmuls (FLOP-countable)

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size

    @classmethod
    def from_args(cls, args):
        return cls(num_layers=args.num_layers, hidden_size=args.hidden_size,
                   num_attention_heads=args.num_attention_heads,
                   padded_vocab_size=args.padded_vocab_size,
                   max_position_embeddings=args.max_position_embeddings,
                   ffn_hidden_size=args.ffn_hidden_size, hidden_dropout=args.hidden_dropout,
                   attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
                   layernorm_epsilon=args.layernorm_epsilon, params_dtype=args.params_dtype,
                   checkpoint_activations=args.checkpoint_activations,
                   checkpoint_num_layers=args.checkpoint_num_layers,
                   attention_impl=args.attention_impl)

    def init_method(self):
        std = self.init_method_std
        return lambda w: nn.init.normal_(w, mean=0.0, std=std)

    def output_init_method(self):
        """Projections that write into the residual stream: std / sqrt(2 * layers) (GPT-2)."""
        std = self.init_method_std / math.sqrt(2.0 * self.num_layers)
        return lambda w: nn.init.normal_(w, mean=0.0, std=std)
