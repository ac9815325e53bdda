"""A tiny GPT config and batch shared by the model tests."""
import torch

from megatron.model.config import GPTConfig
from megatron.model.shape import ModelShape

SEED = 1234
SHAPE_FIELDS = set(ModelShape.__dataclass_fields__)


def tiny_config(**overrides):
    """Shape fields (vocab_size is used as given: 128 is a multiple of 128 x TP 1) and numerics."""
    values = dict(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=128, seq_length=16,
                  hidden_dropout=0.0, attention_dropout=0.0)
    values.update(overrides)
    shape = ModelShape(**{k: v for k, v in values.items() if k in SHAPE_FIELDS})
    return GPTConfig(shape, **{k: v for k, v in values.items() if k not in SHAPE_FIELDS})


def tiny_batch(config, batch_size=2, seq_length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, config.shape.padded_vocab_size, (batch_size, seq_length + 1), generator=g)
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    return tokens, labels, torch.ones(labels.shape)
