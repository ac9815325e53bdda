"""GPT transformer block, Megatron layout: pre-LayerNorm, fused column-parallel QKV,
row-parallel output projections, GeLU MLP. Activations are [s, b, h] (sequence first)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron import mpu
from megatron.mpu.layers import divide
from .layer_norm import LayerNorm
from .moe import build_mlp


class ParallelMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        h, f = config.shape.hidden_size, config.shape.ffn_hidden_size
        self.dense_h_to_4h = mpu.ColumnParallelLinear(h, f, config.init_method(), params_dtype=config.params_dtype)
        self.dense_4h_to_h = mpu.RowParallelLinear(f, h, config.output_init_method(), params_dtype=config.params_dtype)

    def forward(self, hidden_states):
        # [s, b, h] -> [s, b, 4h/tp] -> [s, b, h]
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(hidden_states)))


class ParallelAttention(nn.Module):
    """Causal self-attention; this TP rank computes heads [rank*np, (rank+1)*np)."""

    def __init__(self, config):
        super().__init__()
        tp = mpu.get_tensor_model_parallel_world_size()
        h = config.shape.hidden_size
        self.num_heads = divide(config.shape.num_attention_heads, tp)  # local heads
        self.head_dim = config.shape.head_dim
        self.dropout_p = config.attention_dropout
        self.attention_impl = config.attention_impl
        # output rows grouped per head as [q_i, k_i, v_i], so a TP slice holds whole heads
        self.query_key_value = mpu.ColumnParallelLinear(h, 3 * h, config.init_method(),
                                                        params_dtype=config.params_dtype)
        self.dense = mpu.RowParallelLinear(h, h, config.output_init_method(), params_dtype=config.params_dtype)
        self._causal_mask = None  # built once per sequence length, reused every step

    def _math_attention(self, q, k, v, dropout_p):
        # q, k, v: [b, np, s, hn]; matmuls spelled out so FlopCounterMode sees them on CPU
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [b, np, s, s]
        s = q.size(2)
        if self._causal_mask is None or self._causal_mask.size(0) != s or self._causal_mask.device != q.device:
            self._causal_mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
        scores = scores.masked_fill(self._causal_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        probs = F.dropout(probs, p=dropout_p)
        return torch.matmul(probs, v)

    def forward(self, hidden_states):
        s, b, _ = hidden_states.shape
        mixed = self.query_key_value(hidden_states)                   # [s, b, np*3*hn]
        mixed = mixed.view(s, b, self.num_heads, 3 * self.head_dim)
        q, k, v = mixed.permute(1, 2, 0, 3).split(self.head_dim, dim=-1)  # each [b, np, s, hn]
        dropout_p = self.dropout_p if self.training else 0.0
        # heads differ per TP rank, so their dropout masks come from the model-parallel RNG
        with mpu.get_cuda_rng_tracker().fork():
            if self.attention_impl == "sdpa":
                context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:
                context = self._math_attention(q, k, v, dropout_p)
        context = context.permute(2, 0, 1, 3).reshape(s, b, self.num_heads * self.head_dim)
        return self.dense(context)                                   # [s, b, h]


class ParallelTransformerLayer(nn.Module):
    def __init__(self, config, layer_number):
        super().__init__()
        self.layer_number = layer_number
        self.hidden_dropout = config.hidden_dropout
        self.input_layernorm = LayerNorm(config.shape.hidden_size, eps=config.layernorm_epsilon)
        self.self_attention = ParallelAttention(config)
        self.post_attention_layernorm = LayerNorm(config.shape.hidden_size, eps=config.layernorm_epsilon)
        self.mlp = build_mlp(config, layer_number)  # ParallelMLP, or DeepSpeed's MoE in an MoE layer

    def forward(self, hidden_states):
        # hidden states are replicated across TP ranks: default RNG, identical masks
        attn = self.self_attention(self.input_layernorm(hidden_states))
        hidden_states = hidden_states + F.dropout(attn, p=self.hidden_dropout, training=self.training)
        mlp = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + F.dropout(mlp, p=self.hidden_dropout, training=self.training)


class ParallelTransformerLayerPipe(ParallelTransformerLayer):
    """The pipeline stage's unit; DeepSpeed partitions stages by counting these
    (`partition_method="type:transformer"`) and checkpoints them."""


class ParallelTransformer(nn.Module):
    """The non-pipeline stack: layers + final LayerNorm, with optional activation checkpointing
    of every `checkpoint_num_layers` layers."""

    def __init__(self, config, layer_seed_fn=None):
        super().__init__()
        self.checkpoint_activations = config.checkpoint_activations
        self.checkpoint_num_layers = config.checkpoint_num_layers
        layers = []
        for i in range(config.shape.num_layers):
            if layer_seed_fn is not None:
                layer_seed_fn(i)
            layers.append(ParallelTransformerLayer(config, layer_number=i + 1))
        self.layers = nn.ModuleList(layers)
        if layer_seed_fn is not None:
            layer_seed_fn(config.shape.num_layers)
        self.final_layernorm = LayerNorm(config.shape.hidden_size, eps=config.layernorm_epsilon)

    def _run(self, start, end):
        def forward(hidden_states):
            for layer in self.layers[start:end]:
                hidden_states = layer(hidden_states)
            return hidden_states
        return forward

    def forward(self, hidden_states):
        if self.checkpoint_activations and self.training:
            n = len(self.layers)
            for start in range(0, n, self.checkpoint_num_layers):
                end = min(start + self.checkpoint_num_layers, n)
                hidden_states = mpu.checkpoint(self._run(start, end), hidden_states)
        else:
            hidden_states = self._run(0, len(self.layers))(hidden_states)
        return self.final_layernorm(hidden_states)
