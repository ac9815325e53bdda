"""The transformer's MLP (GeLU or a GLU), tensor-parallel or whole: the dense layers' MLP slot and,
built by the same class, every expert of an MoE layer (megatron/model/moe/layer.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron import mpu

from .config import GPTConfig

GLU_ACTIVATION_FUNCTIONS = {"geglu": F.gelu, "liglu": lambda x: x, "reglu": F.relu, "swiglu": F.silu}
# the non-gated MLP's (ModelShape.activation): --openai-gelu is Megatron's openai_gelu,
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which torch computes as gelu's tanh approximation
ACTIVATION_FUNCTIONS = {"gelu": F.gelu, "openai_gelu": lambda x: F.gelu(x, approximate="tanh"),
                        "squared_relu": lambda x: torch.square(F.relu(x))}


class ParallelMLP(nn.Module):
    """GeLU MLP, or a GLU: act(gate) * value. A GLU's dense_h_to_4h has 2f output rows laid out
    as pairs (row 2j: gate unit j, row 2j+1: its value unit), so the TP chunk of a rank holds the
    matching gates and values and TP=n computes the function of TP=1 from its slices.
    tensor_parallel=False: the same MLP whole on this rank (an MoE expert that is not TP-split)."""

    def __init__(self, config: GPTConfig, tensor_parallel: bool = True) -> None:
        super().__init__()
        shape = config.shape
        h, f, bias = shape.hidden_size, shape.ffn_hidden_size, shape.add_bias_linear
        self.glu = GLU_ACTIVATION_FUNCTIONS[shape.glu_activation] if shape.glu else None
        self.activation = ACTIVATION_FUNCTIONS[shape.activation]
        self.dense_h_to_4h = mpu.ColumnParallelLinear(h, 2 * f if self.glu else f, config.init_method(), bias=bias,
                                                      params_dtype=config.params_dtype,
                                                      tensor_parallel=tensor_parallel,
                                                      sequence_parallel=config.sequence_parallel)
        self.dense_4h_to_h = mpu.RowParallelLinear(f, h, config.output_init_method(), bias=bias,
                                                   params_dtype=config.params_dtype, tensor_parallel=tensor_parallel,
                                                   sequence_parallel=config.sequence_parallel)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [s, b, h] -> [s, b, f/tp] (a GLU: [s, b, 2f/tp] -> gate, value) -> [s, b, h]
        intermediate = self.dense_h_to_4h(hidden_states)
        if self.glu is None:
            return self.dense_4h_to_h(self.activation(intermediate))
        gate, value = intermediate.unflatten(-1, (-1, 2)).unbind(-1)
        return self.dense_4h_to_h(self.glu(gate) * value)
