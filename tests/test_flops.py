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
