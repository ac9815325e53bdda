"""--torch-compile: each transformer layer's forward compiled by torch.compile (inductor), so the
elementwise chains between its matmuls (bias + GeLU / GLU, dropout + residual add, the norms) run
as fused kernels, on CPU (C++ / OpenMP) and on CUDA (Triton). `Module.compile()` compiles in place:
the parameters, their names (checkpoints, export, the count) and the pipeline's layer list are
unchanged. TorchDynamo treats nn.Module parameters as inputs (torch >= 2.5), so all layers of a
model share one compiled graph rather than recompiling per layer. Collectives (TP, SP) and, with
dropout, the model-parallel RNG's fork split a layer into several graphs; each piece still fuses its
chains."""
from __future__ import annotations

import torch
from torch import nn

from .transformer import ParallelTransformerLayer


def compile_transformer_layers(model: nn.Module) -> int:
    """Compiles every transformer layer of `model` in place; returns how many."""
    # a piece between graph breaks compiles once per linear shape it serves (QKV, dense, h->4h,
    # 4h->h) and grad mode (training, a checkpointed forward under no_grad, evaluation): more than
    # torch's default of 8 recompiles per frame, after which it would silently run eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    layers = [m for m in model.modules() if isinstance(m, ParallelTransformerLayer)]
    for layer in layers:
        layer.compile()
    return len(layers)
