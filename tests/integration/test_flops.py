"""The FLOPs formula equals what torch's FlopCounterMode measures on a real forward+backward."""
import pytest

from megatron.model.analytic import flops_per_sample
from megatron.model.shape import ModelShape
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config

SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32)
BATCH, SEQ = 2, 32


def _measure(settings):
    """FLOPs of a forward+backward of the non-pipeline model per (checkpointing, method, N)."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.gpt_model import GPTModel
    measured = []
    for checkpoint_activations, method, num_layers in settings:
        # "math" attention spells out QK^T and PV as matmuls, which FlopCounterMode sees on CPU
        config = tiny_config(**dict(SHAPE, num_layers=3), checkpoint_activations=checkpoint_activations,
                             checkpoint_method=method, checkpoint_num_layers=num_layers, attention_impl="math")
        model = GPTModel(config, seed=SEED).train()
        tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=SEQ)
        with FlopCounterMode(display=False) as counter:
            model(tokens, labels, loss_mask).backward()
        measured.append(counter.get_total_flops())
    return measured


def _layer_forward(s=SEQ, h=64):
    """One GPT-2 layer's forward matmul FLOPs per sequence, by hand: QKV 6sh^2, scores and context
    2 x 2s^2h, projection 2sh^2, MLP 2 x 2sh(4h)."""
    return 6 * s * h * h + 4 * s * s * h + 2 * s * h * h + 16 * s * h * h


def test_formula_matches_measured_flops():
    """No checkpointing, uniform chunks of 2 of the 3 layers, and the block method (the first 1 or
    5 layers, more than the model has): the formula equals FlopCounterMode's count, and the
    recompute is one forward of exactly the recomputed layers."""
    settings = [(False, "uniform", 1), (True, "uniform", 2), (True, "block", 1), (True, "block", 5)]
    [measured] = run_distributed(1, _measure, settings)
    shape = ModelShape(**dict(SHAPE, num_layers=3))
    for (checkpointing, method, n), flops in zip(settings, measured, strict=True):
        # the formula counts exactly the matmuls the model runs: equal, not merely within 1 %
        assert flops == BATCH * flops_per_sample(shape, checkpointing, method, n), (method, n)
    plain = measured[0]
    assert [m - plain for m in measured[1:]] == [BATCH * layers * _layer_forward() for layers in (3, 1, 3)]


def test_formula_terms_by_hand():
    """Narayanan et al. eq. 3 (f = 4h): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with recompute."""
    l, h, s, v = 8, 512, 1024, 50304
    shape = ModelShape(num_layers=l, hidden_size=h, num_attention_heads=8, seq_length=s, vocab_size=v)
    with_recompute = 96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert flops_per_sample(shape, True) == pytest.approx(with_recompute, rel=1e-12)  # float form
    without = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert flops_per_sample(shape, False) == pytest.approx(without, rel=1e-12)


PIPE_LAYERS = 5  # not a multiple of 2 or 3: chunks of k layers end unevenly on each stage


def _measure_pipeline_steps(recompute_settings):
    """FLOPs of one real training step of the pipeline engine on this rank, per setting."""
    import argparse

    import deepspeed
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from megatron import mpu
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.mpu.random import configure_deepspeed_checkpointing
    measured = []
    for checkpoint_num_layers, deepspeed_checkpointing, method in recompute_settings:
        if deepspeed_checkpointing:  # --deepspeed-activation-checkpointing: deepspeed.checkpointing recomputes
            configure_deepspeed_checkpointing(argparse.Namespace(
                partition_activations=False, contigious_checkpointing=False, num_layers=PIPE_LAYERS,
                checkpoint_in_cpu=False, synchronize_each_layer=False, profile_backward=False), mpu)
            mpu.model_parallel_seed(SEED)  # as initialize_megatron does after configuring it
        config = tiny_config(**dict(SHAPE, num_layers=PIPE_LAYERS), attention_impl="math",
                             checkpoint_activations=checkpoint_num_layers > 0,
                             checkpoint_num_layers=max(1, checkpoint_num_layers), checkpoint_method=method)
        model = GPTModelPipe(config, topology=mpu.get_topology(), seed=SEED)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                               config={"train_micro_batch_size_per_gpu": BATCH,
                                                       "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9})
        tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=SEQ)
        with FlopCounterMode(display=False) as counter:
            engine.train_batch(iter([(tokens, (labels, loss_mask))]))
        measured.append(counter.get_total_flops())
    return measured


def test_pipeline_train_step_recomputes_every_layer():
    """The pipeline engine's real step at PP=2, summed over both stages: without checkpointing
    the formula's factor 3, with --checkpoint-activations --checkpoint-num-layers k one more
    forward of every transformer layer for k = 1, 2, 3 (and with DeepSpeed's checkpointing); with
    --activations-checkpoint-method block and k = 1, 2 one more forward of the first k layers of
    each stage (the 5 layers are split 3 + 2 or 2 + 3: 2 and 4 layers recomputed either way)."""
    settings = [(0, False, "uniform"), (1, False, "uniform"), (2, False, "uniform"), (3, False, "uniform"),
                (1, False, "block"), (2, False, "block"), (2, True, "uniform")]  # DeepSpeed's last: it stays on
    per_rank = run_distributed(2, _measure_pipeline_steps, settings, pp=2)
    measured = [a + b for a, b in zip(*per_rank, strict=True)]
    shape = ModelShape(**dict(SHAPE, num_layers=PIPE_LAYERS))
    assert measured[0] == BATCH * flops_per_sample(shape, False)
    assert measured[1:4] + measured[6:] == [BATCH * flops_per_sample(shape, True)] * 4
    staged = ModelShape(**dict(SHAPE, num_layers=PIPE_LAYERS, pipeline_model_parallel_size=2))
    assert measured[4:6] == [BATCH * flops_per_sample(staged, True, "block", k) for k in (1, 2)]
    # the recompute is one forward of the recomputed layers: (4 - 3) x the per-layer forward FLOPs
    assert [m - measured[0] for m in measured[1:]] == [BATCH * n * _layer_forward() for n in (5, 5, 5, 2, 4, 5)]
