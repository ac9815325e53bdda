"""The fp16 memory rows (megatron/metrics/memory.py, ZeRO 0) against DeepSpeed's own allocation.

DeepSpeed's engine refuses fp16 on this CPU ("Type fp16 is not supported on your device"), so no
step can run; but its fp16 optimizer wrappers build on CPU, and building one is what allocates
their memory: FP16_UnfusedOptimizer clones an fp32 master per parameter and FP16_Optimizer one
flat fp32 master per param group, and both run the wrapped Adam once over zero gradients to
create its state. The test builds the trainer's GPTModel in fp16, wraps torch's AdamW (the
trainer's optimizer on CPU) in each wrapper, measures the tensors the wrapper and Adam hold, and
compares them with the prediction and with bytes per parameter counted by hand. The gradients
(fp16, 2 bytes per parameter when the step starts) and the fp32 gradient copies made inside
step() are checked by hand only: they exist only during a step."""
import pytest

from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_config

H, L, V, S = 32, 2, 128, 16  # tiny_config: 2 layers, hidden 32, vocab 128, seq 16 (learned positions)
# by hand: embedding V x h + positions S x h; per layer 4h^2 + 4h (QKV, dense) + 8h^2 + 5h (MLP) + 4h (two
# LayerNorms); final LayerNorm 2h
N = V * H + S * H + L * (12 * H * H + 13 * H) + 2 * H
TENSORS = 2 + 12 * L + 2  # embedding (2), 12 per layer, final LayerNorm (2)


def _storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views of one flat buffer count once)."""
    seen = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _build_wrappers():
    """{wrapper: (weights, masters, adam state) bytes} as DeepSpeed allocates them, no step taken."""
    import torch
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    from megatron.model.gpt_model import GPTModel
    measured = {}
    for name, wrapper in (("fp16_unfused", FP16_UnfusedOptimizer), ("fp16_fused", FP16_Optimizer)):
        model = GPTModel(tiny_config(), seed=SEED).half()
        params = list(model.parameters())
        # the trainer's two groups: matrices decayed, biases and norms not (megatron/training/optimizer.py)
        groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": 0.01},
                  {"params": [p for p in params if p.ndim == 1], "weight_decay": 0.0}]
        optimizer = wrapper(torch.optim.AdamW(groups, lr=1e-3), static_loss_scale=1.0)
        masters = optimizer.fp32_groups if name == "fp16_unfused" else [optimizer.fp32_groups_flat]
        state = [t for s in optimizer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        measured[name] = (_storage_bytes(list(model.parameters())),
                          _storage_bytes([t for g in masters for t in g]), _storage_bytes(state),
                          sum(1 for s in optimizer.optimizer.state.values() if "step" in s))
    return measured


@pytest.fixture(scope="module")
def deepspeed_fp16():
    # a timeout: an fp16 path that blocks on CPU fails the test instead of hanging the suite
    return run_distributed(1, _build_wrappers, timeout=120)[0]


def _predicted(fused):
    from megatron.metrics.memory import TrainingSetup, predict_memory
    shape = tiny_config().shape
    [rank] = predict_memory(shape, TrainingSetup(precision="fp16", pipeline=False, fused_adam=fused))
    return rank


def test_unfused_fp16_optimizer_memory_is_deepspeeds_allocation(deepspeed_fp16):
    weights, masters, state, steps = deepspeed_fp16["fp16_unfused"]
    # DeepSpeed's allocation, by hand: fp16 weights 2 B, an fp32 master 4 B and Adam's two fp32
    # moments 8 B per parameter, and a 4-byte `step` tensor per master tensor
    assert (weights, masters, state, steps) == (2 * N, 4 * N, 8 * N + 4 * TENSORS, TENSORS)
    rank = _predicted(fused=False)
    assert rank.weights == weights
    assert rank.optimizer == masters + state
    assert rank.gradients == 2 * N  # fp16 .grad of every parameter when the step starts
    assert rank.transient == 4 * N  # step() copies each gradient to fp32 before unscaling


def test_fused_fp16_optimizer_memory_is_deepspeeds_allocation(deepspeed_fp16):
    weights, masters, state, steps = deepspeed_fp16["fp16_fused"]
    # one flat fp16 buffer and one flat fp32 master per group (2 groups, no padding); Adam's
    # moments over each flat master; torch's AdamW adds a 4-byte `step` per flat master, which
    # FusedAdam (the optimizer this branch describes: apex on CUDA) keeps in the param group instead
    assert (weights, masters, state, steps) == (2 * N, 4 * N, 8 * N + 4 * 2, 2)
    rank = _predicted(fused=True)
    assert rank.weights == weights
    assert rank.optimizer == masters + state - 4 * steps
    assert rank.gradients == 2 * N
    assert rank.transient == 4 * N
