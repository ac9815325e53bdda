"""GPT transformer block, Megatron layout: pre-norm (LayerNorm or RMSNorm), fused column-parallel
QKV (multi-head, grouped- or multi-query), row-parallel output projections, GeLU or GLU MLP
(mlp.py) or an MoE layer (moe/), learned / rotary / ALiBi / no positions. Activations are [s, b, h]
(sequence first)."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from megatron import mpu
from megatron.mpu.layers import divide

from .config import GPTConfig
from .documents import document_mask
from .layer_norm import build_norm_module
from .mlp import ParallelMLP
from .moe.layer import MoEMLP
from .positional_embeddings import alibi_causal_bias, alibi_slopes, apply_rotary, rotary_tables


def build_norm(config: GPTConfig) -> nn.Module:
    """A transformer norm (input, post-attention, final). Under sequence parallelism it runs on a
    sequence shard, so its parameters' gradients are partial: tagged for the TP sum."""
    shape = config.shape
    norm = build_norm_module(shape.normalization, shape.hidden_size, config.layernorm_epsilon,
                             one_plus=shape.apply_layernorm_1p, mixed=config.fp32_residual_connection)
    if config.sequence_parallel:
        for p in norm.parameters():
            mpu.mark_sequence_parallel(p)
    return norm


def build_mlp(config: GPTConfig, layer_number: int) -> ParallelMLP | MoEMLP:
    """The MLP slot of transformer layer `layer_number` (1-based): ParallelMLP or MoEMLP."""
    num_experts = config.shape.experts_per_layer()[layer_number - 1]
    return ParallelMLP(config) if num_experts == 1 else MoEMLP(config, num_experts)


class ParallelAttention(nn.Module):
    """Causal self-attention with a query heads sharing g key/value heads (g = a: multi-head,
    g = 1: multi-query). This TP rank computes query heads [rank*np, (rank+1)*np) and their
    g/tp key/value heads. The fused QKV weight has one row block per kv group -- its a/g query
    heads, then its key head, then its value head -- so a TP chunk holds whole groups."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        shape = config.shape
        tp = mpu.get_tensor_model_parallel_world_size()
        h, d = shape.hidden_size, shape.kv_channels
        a, g = shape.num_attention_heads, shape.num_key_value_heads
        self.num_heads = divide(a, tp)            # local query heads
        self.num_kv_heads = divide(g, tp)         # local key/value heads
        self.group_size = a // g                  # query heads per key/value head
        self.head_dim = d
        self.dropout_p = config.attention_dropout
        self.attention_impl = config.attention_impl
        self.softmax_in_fp32 = config.attention_softmax_in_fp32
        self.position_embedding_type = shape.position_embedding_type
        self.rope_theta = config.rope_theta
        self.rotary_dim = shape.rotary_dim  # --rotary-percent: the first rotary_dim channels rotate
        # --reset-position-ids acts on the learned table only (language_model.py), as in both forks and
        # Megatron-LM: rotary and ALiBi see relative distances, the same within a document
        self.reset_attention_mask = config.reset_attention_mask
        self.query_key_value = mpu.ColumnParallelLinear(h, (a + 2 * g) * d, config.init_method(),
                                                        bias=shape.qkv_bias, params_dtype=config.params_dtype,
                                                        sequence_parallel=config.sequence_parallel)
        self.dense = mpu.RowParallelLinear(a * d, h, config.output_init_method(), bias=shape.add_bias_linear,
                                           params_dtype=config.params_dtype, sequence_parallel=config.sequence_parallel)
        # DeepSpeed-Ulysses: the attention core sees every position of heads/SP of this rank's heads
        sp = mpu.get_sequence_parallel_world_size()
        core_heads = divide(self.num_heads, sp)
        if self.position_embedding_type == "alibi":
            # the slopes of the heads this rank's attention core computes
            first = (mpu.get_tensor_model_parallel_rank() * self.num_heads
                     + mpu.get_sequence_parallel_rank() * core_heads)
            slopes = alibi_slopes(a)[first:first + core_heads]
            self.register_buffer("alibi_slopes", torch.tensor(slopes, dtype=torch.float32), persistent=False)
        self._cache = {}  # (kind, s, device, dtype) -> causal mask / ALiBi bias / rotary tables
        # DeepSpeed's DistributedAttention around the core (None without SP); not a submodule: no state
        self._sequence_parallel_attention = mpu.sequence_parallel_attention(self._core_attention)

    def _cached(self, kind, s, ref, build):
        key = (kind, s, ref.device, ref.dtype)
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def _alibi_bias(self, s, q):
        return self._cached("alibi", s, q, lambda: alibi_causal_bias(self.alibi_slopes, s, q.device, q.dtype))

    def _math_attention(self, q, k, v, dropout_p, doc_mask=None):
        # q [b, np, s, hn]; k, v [b, ng, s, hn]; matmuls spelled out so FlopCounterMode sees them on CPU
        if self.group_size > 1:  # each key/value head serves the query heads of its group
            k, v = (t.repeat_interleave(self.group_size, dim=1) for t in (k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [b, np, s, s]
        s = q.size(2)
        if self.position_embedding_type == "alibi":
            scores = scores + self._alibi_bias(s, scores)
        if doc_mask is not None:  # causal and within the document
            scores = scores.masked_fill(doc_mask, float("-inf"))
        elif self.position_embedding_type != "alibi":
            mask = self._cached("causal", s, q, lambda: torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1))
            scores = scores.masked_fill(mask, float("-inf"))
        # Megatron's unfused softmax: in fp32 (--attention-softmax-in-fp32, query-key layer scaling),
        # or in the activations' dtype
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32 if self.softmax_in_fp32 else None).to(q.dtype)
        probs = F.dropout(probs, p=dropout_p)
        return torch.matmul(probs, v)

    def _sdpa_attention(self, q, k, v, dropout_p, doc_mask=None):
        gqa = self.group_size > 1
        if doc_mask is not None:  # causal and within the document; ALiBi's bias added where allowed
            bias = self._alibi_bias(q.size(2), q) if self.position_embedding_type == "alibi" else 0.0
            mask = torch.zeros(doc_mask.shape, dtype=q.dtype, device=q.device).masked_fill(doc_mask, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask + bias, dropout_p=dropout_p,
                                                  enable_gqa=gqa)
        if self.position_embedding_type == "alibi":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._alibi_bias(q.size(2), q),
                                                  dropout_p=dropout_p, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)

    def forward(self, hidden_states: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """doc_ids [b, s]: the documents of the samples (megatron/model/documents.py), with
        --reset-position-ids / --reset-attention-mask (not under DeepSpeed-Ulysses: refused)."""
        mixed = self.query_key_value(hidden_states)                      # [s, b, ng*(a/g+2)*hn]
        # Megatron sequence parallelism: the whole sequence (gathered); DeepSpeed-Ulysses: this
        # rank's chunk of it (s/SP tokens)
        s, b = mixed.shape[:2]
        mixed = mixed.view(s, b, self.num_kv_heads, self.group_size + 2, self.head_dim)
        q = mixed[:, :, :, :self.group_size].reshape(s, b, self.num_heads, self.head_dim)
        k, v = mixed[:, :, :, self.group_size], mixed[:, :, :, self.group_size + 1]  # [s, b, ng, hn]
        if self._sequence_parallel_attention is None:
            context = self._core_attention(q, k, v, doc_ids)             # [s, b, np, hn]
        else:  # all-to-all to [S, b, np/SP, hn] (S: the whole sequence), the core, and back
            context = self._sequence_parallel_attention(q, k, v)
        return self.dense(context.reshape(s, b, self.num_heads * self.head_dim))  # [s, b, h]

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """q [s, b, heads, hn], k, v [s, b, kv heads, hn] of the whole sequence -> [s, b, heads, hn].
        Positions (rotary, ALiBi, the causal mask) are those of the whole sequence, also under
        DeepSpeed-Ulysses, where this runs between DistributedAttention's all-to-alls."""
        s = q.size(0)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))                # [b, heads, s, hn]
        if self.position_embedding_type == "rotary":
            cos, sin = self._cached("rotary", s, q,
                                    lambda: rotary_tables(s, self.rotary_dim, self.rope_theta, q.device))
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        doc_mask = document_mask(doc_ids) if self.reset_attention_mask and doc_ids is not None else None
        dropout_p = self.dropout_p if self.training else 0.0
        # heads differ per TP rank, so their dropout masks come from the model-parallel RNG (no
        # dropout draws nothing: no fork, which would split a --torch-compile graph)
        with mpu.get_cuda_rng_tracker().fork() if dropout_p > 0 else contextlib.nullcontext():
            # sdpa's kernels accumulate the softmax in fp32 whatever the flags say, as the forks' fused
            # softmax and flash kernels do; the softmax's dtype is the math path's (the unfused softmax)
            if self.attention_impl == "sdpa":
                context = self._sdpa_attention(q, k, v, dropout_p, doc_mask)
            else:
                context = self._math_attention(q, k, v, dropout_p, doc_mask)
        return context.permute(2, 0, 1, 3)                                 # [s, b, heads, hn]


class ParallelTransformerLayer(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.total_layers = config.shape.num_layers  # the model's, whichever stage holds this layer
        self.hidden_dropout = config.hidden_dropout
        self.post_layernorm_residual = config.shape.apply_residual_connection_post_layernorm
        # hidden states hold this rank's part of the sequence (Megatron's shards, Ulysses' chunks)
        self.sequence_sharded = config.sequence_parallel or mpu.get_sequence_parallel_world_size() > 1
        self.input_layernorm = build_norm(config)
        self.self_attention = ParallelAttention(config)
        self.post_attention_layernorm = build_norm(config)
        self.mlp = build_mlp(config, layer_number)  # ParallelMLP, or DeepSpeed's MoE in an MoE layer

    def forward(self, hidden_states: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[s, b, h] -> [s, b, h] ([s/tp, b, h] shards under sequence parallelism). An MoE layer's
        load-balancing loss rides on its MLP output's gradient (megatron/model/moe/aux_loss.py)."""
        normed = self.input_layernorm(hidden_states)
        attn = self.self_attention(normed, doc_ids)
        # the residual: the norm's input (pre-norm, GPT-2), or its output (--apply-residual-connection-
        # post-layernorm); under --fp32-residual-connection the sum is fp32 (type promotion)
        residual = normed if self.post_layernorm_residual else hidden_states
        with self._dropout_rng():
            hidden_states = residual + F.dropout(attn, p=self.hidden_dropout, training=self.training)
        normed = self.post_attention_layernorm(hidden_states)
        mlp = self.mlp(normed)
        residual = normed if self.post_layernorm_residual else hidden_states
        with self._dropout_rng():
            return residual + F.dropout(mlp, p=self.hidden_dropout, training=self.training)

    def _dropout_rng(self) -> contextlib.AbstractContextManager:
        # replicated hidden states: the default RNG, identical masks on every TP rank; sequence
        # shards / chunks: each rank's own masks, from the model-parallel RNG (as attention's dropout)
        sharded = self.sequence_sharded and self.hidden_dropout > 0 and self.training  # else no draw
        return mpu.get_cuda_rng_tracker().fork() if sharded else contextlib.nullcontext()


Layer = Callable[..., torch.Tensor]  # (hidden states[, doc_ids]) -> hidden states


def run_layers(layers: Iterable[Layer], hidden_states: torch.Tensor,
               doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Transformer layers in order; doc_ids (megatron/model/documents.py) goes to each."""
    for layer in layers:
        hidden_states = layer(hidden_states) if doc_ids is None else layer(hidden_states, doc_ids)
    return hidden_states


def checkpointed(layers: Iterable[Layer], hidden_states: torch.Tensor,
                 doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """run_layers, recomputed in backward (doc_ids needs no gradient: the recompute reads it as is)."""
    return mpu.checkpoint(lambda x: run_layers(layers, x, doc_ids), hidden_states)


def checkpoint_chunks(num_layers: int, method: str, chunk_layers: int) -> list[tuple[int, int, bool]]:
    """[(start, end, recomputed)] covering a stage's `num_layers` transformer layers in order.
    uniform: chunks of `chunk_layers`, each checkpointed; block: the first `chunk_layers` layers
    checkpointed one by one, the rest run plainly (Megatron's --activations-checkpoint-method)."""
    if method == "block":
        k = min(chunk_layers, num_layers)
        return [(i, i + 1, True) for i in range(k)] + ([(k, num_layers, False)] if k < num_layers else [])
    return [(i, min(i + chunk_layers, num_layers), True) for i in range(0, num_layers, chunk_layers)]


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    """The pipeline stage's unit; DeepSpeed partitions stages by counting these
    (`partition_method="type:transformer"`) and checkpoints them."""


class ParallelTransformer(nn.Module):
    """The non-pipeline stack: layers + final LayerNorm, with optional activation checkpointing
    (`checkpoint_chunks`)."""

    def __init__(self, config: GPTConfig, layer_seed_fn: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.checkpoint_activations = config.checkpoint_activations
        self.checkpoint_num_layers = config.checkpoint_num_layers
        self.checkpoint_method = config.checkpoint_method
        layers = []
        for i in range(config.shape.num_layers):
            if layer_seed_fn is not None:
                layer_seed_fn(i)
            layers.append(ParallelTransformerLayer(config, layer_number=i + 1))
        self.layers = nn.ModuleList(layers)
        if layer_seed_fn is not None:
            layer_seed_fn(config.shape.num_layers)
        self.final_layernorm = build_norm(config)

    def forward(self, hidden_states: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final norm."""
        if self.checkpoint_activations and self.training:
            for start, end, recomputed in checkpoint_chunks(len(self.layers), self.checkpoint_method,
                                                            self.checkpoint_num_layers):
                layers = self.layers[start:end]
                run = checkpointed if recomputed else run_layers
                hidden_states = run(layers, hidden_states, doc_ids)
        else:
            hidden_states = run_layers(self.layers, hidden_states, doc_ids)
        return self.final_layernorm(hidden_states)
