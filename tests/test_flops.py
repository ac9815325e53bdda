"""The FLOPs formula equals what torch's FlopCounterMode measures on a real forward+backward."""
import pytest

from distributed import run_distributed
from model_fixtures import SEED, tiny_batch, tiny_config
from megatron.model.analytic import flops_per_sample
from megatron.model.shape import ModelShape

SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32)
BATCH, SEQ = 2, 32


def _measure(checkpoint_activations):
    from torch.utils.flop_counter import FlopCounterMode
    from megatron.model.gpt_model import GPTModel
    # "math" attention spells out QK^T and PV as matmuls, which FlopCounterMode sees on CPU
    config = tiny_config(**SHAPE, checkpoint_activations=checkpoint_activations, attention_impl="math")
    model = GPTModel(config, seed=SEED).train()
    tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=SEQ)
    with FlopCounterMode(display=False) as counter:
        model(tokens, labels, loss_mask).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("checkpoint_activations", [False, True])
def test_formula_matches_measured_flops(checkpoint_activations):
    [measured] = run_distributed(1, _measure, checkpoint_activations)
    formula = BATCH * flops_per_sample(ModelShape(**SHAPE), checkpoint_activations)
    # the formula counts exactly the matmuls the model runs: equal, not merely within 1 %
    assert measured == formula


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
    for checkpoint_num_layers, deepspeed_checkpointing in recompute_settings:
        if deepspeed_checkpointing:  # --deepspeed-activation-checkpointing: deepspeed.checkpointing recomputes
            configure_deepspeed_checkpointing(argparse.Namespace(
                partition_activations=False, contigious_checkpointing=False, num_layers=PIPE_LAYERS,
                checkpoint_in_cpu=False, synchronize_each_layer=False, profile_backward=False), mpu)
            mpu.model_parallel_seed(SEED)  # as initialize_megatron does after configuring it
        config = tiny_config(**dict(SHAPE, num_layers=PIPE_LAYERS), attention_impl="math",
                             checkpoint_activations=checkpoint_num_layers > 0,
                             checkpoint_num_layers=max(1, checkpoint_num_layers))
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
    forward of every transformer layer for k = 1, 2, 3 (and with DeepSpeed's checkpointing)."""
    settings = [(0, False), (1, False), (2, False), (3, False), (2, True)]
    per_rank = run_distributed(2, _measure_pipeline_steps, settings, pp=2)
    measured = [a + b for a, b in zip(*per_rank)]
    shape = ModelShape(**dict(SHAPE, num_layers=PIPE_LAYERS))
    assert measured[0] == BATCH * flops_per_sample(shape, False)
    assert measured[1:] == [BATCH * flops_per_sample(shape, True)] * 4
    # the recompute is one forward of the 5 layers: (4 - 3) x the per-layer forward FLOPs
    s, h = SEQ, SHAPE["hidden_size"]
    assert measured[1] - measured[0] == BATCH * PIPE_LAYERS * (8 * s * h * h + 4 * s * s * h + 4 * s * h * 4 * h)
