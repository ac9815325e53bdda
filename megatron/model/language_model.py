"""Input embedding (word, then an optional LayerNorm, plus learned positions when the shape has
them), the untied output layer, and the output logits."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron import mpu
from megatron.mpu.layers import _sliced_parameter

from .config import GPTConfig
from .documents import document_positions
from .layer_norm import build_norm_module


class Embedding(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        shape = config.shape
        self.word_embeddings = mpu.VocabParallelEmbedding(shape.padded_vocab_size, shape.hidden_size,
                                                          config.word_embedding_init_method(), config.params_dtype)
        if shape.position_embedding_type == "absolute":
            # replicated on every TP rank; initialised on CPU like the TP layers so layouts agree
            weight = torch.empty(shape.max_position_embeddings, shape.hidden_size, dtype=torch.float32)
            config.init_method()(weight)
            self.position_embeddings = nn.Embedding.from_pretrained(weight.to(config.params_dtype), freeze=False)
        else:  # rotary / ALiBi act inside attention; no table
            self.position_embeddings = None
        # BigScience's --embed-layernorm, on the first stage only: the last stage's tied copy of
        # this module is the output layer and never runs it
        self.embedding_layernorm = None
        if shape.embed_layernorm and mpu.get_pipeline_model_parallel_rank() == 0:
            self.embedding_layernorm = build_norm_module("layernorm", shape.hidden_size, config.layernorm_epsilon,
                                                         one_plus=shape.apply_layernorm_1p)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)
        self.sequence_parallel = config.sequence_parallel  # also read by the tied output layer
        self.reset_position_ids = config.reset_position_ids
        self.fp32_residual_connection = config.fp32_residual_connection

    @property
    def word_embeddings_weight(self) -> torch.Tensor:
        return self.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids: [b, s] -> [s, b, h]; doc_ids [b, s]: megatron/model/documents.py
        embeddings = self.word_embeddings(input_ids)  # [b, s, h]
        if self.embedding_layernorm is not None:
            embeddings = self.embedding_layernorm(embeddings)
        if self.position_embeddings is not None:
            if self.reset_position_ids and doc_ids is not None:  # [b, s]: each document from 0
                positions = document_positions(doc_ids)
            else:  # DeepSpeed-Ulysses: input_ids are this SP rank's chunk; positions stay the sequence's
                first = mpu.get_sequence_parallel_rank() * input_ids.size(1)
                positions = torch.arange(first, first + input_ids.size(1), device=input_ids.device)
            embeddings = embeddings + self.position_embeddings(positions)
        embeddings = embeddings.transpose(0, 1).contiguous()
        if self.fp32_residual_connection:  # the residual stream starts here
            embeddings = embeddings.float()
        if self.sequence_parallel:  # Megatron's: this rank's sequence shard [s/tp, b, h]
            embeddings = mpu.scatter_to_sequence_parallel_region(embeddings)
        elif mpu.get_sequence_parallel_world_size() == 1:
            return self.embedding_dropout(embeddings)
        # a shard (or a Ulysses chunk) of the sequence: its dropout mask is its own (model-parallel RNG)
        with mpu.get_cuda_rng_tracker().fork():
            return self.embedding_dropout(embeddings)


class OutputLayer(nn.Module):
    """The untied output layer (--untie-embeddings-and-output-weights): its own weight [V, h],
    split along the vocabulary like the word embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        shape = config.shape
        self.weight = _sliced_parameter((shape.padded_vocab_size, shape.hidden_size), 0, config.init_method(),
                                        config.params_dtype)
        self.sequence_parallel = config.sequence_parallel

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return parallel_lm_logits(hidden_states, self.weight, self.sequence_parallel)


def parallel_lm_logits(hidden_states: torch.Tensor, word_embeddings_weight: torch.Tensor,
                       sequence_parallel: bool = False) -> torch.Tensor:
    """[s, b, h] x [V/tp, h] -> [s, b, V/tp]: logits for this TP rank's vocabulary slice. Under
    sequence parallelism the final norm's output [s/tp, b, h] is gathered along the sequence here."""
    if sequence_parallel:
        return mpu.linear_with_sequence_gather(hidden_states, word_embeddings_weight)
    hidden_states = mpu.copy_to_tensor_model_parallel_region(hidden_states)
    return F.linear(hidden_states, word_embeddings_weight)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean token loss over the unmasked tokens. logits [s, b, V/tp]; labels, loss_mask [b, s].
    Under DeepSpeed-Ulysses s is this rank's chunk: the token losses and the mask are gathered over
    the SP ranks first, so every SP rank has the mean over the whole sequences (the fork's
    vocab-sequence-parallel loss) and backpropagates only its own tokens' share."""
    losses = mpu.gather_sequence(mpu.vocab_parallel_cross_entropy(logits, labels.t()))  # [s, b]
    loss_mask = mpu.gather_sequence(loss_mask.t().float())
    return (losses * loss_mask).sum() / loss_mask.sum()
