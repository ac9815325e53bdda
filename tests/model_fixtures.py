"""A tiny GPT config and batch shared by the model tests."""
import torch

from megatron.model.config import GPTConfig

SEED = 1234


def tiny_config(**overrides):
    values = dict(num_layers=2, hidden_size=32, num_attention_heads=4, padded_vocab_size=128,
                  max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
    values.update(overrides)
    return GPTConfig(**values)


def tiny_batch(config, batch_size=2, seq_length=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, config.padded_vocab_size, (batch_size, seq_length + 1), generator=g)
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    return tokens, labels, torch.ones(labels.shape)
