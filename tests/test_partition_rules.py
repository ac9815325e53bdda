"""The pipeline split's rules against independent references (survivors of the mutation run,
benchmarks/mutation.sh): DeepSpeed's own partition_uniform / partition_balanced for its methods,
a brute force over every contiguous split for ours (min-max, with a cap), the one-line refusals
of --pp-partition-method, and the stage descriptions. In-process."""
import itertools
import random

import pytest
from deepspeed.runtime.utils import partition_balanced, partition_uniform

from megatron.model.analytic import stage_items
from megatron.model.partition import _min_max, _spread_balanced, _uniform, describe_stage
from megatron.model.shape import ConfigError, ModelShape


def test_uniform_and_balanced_are_deepspeeds():
    rng = random.Random(0)
    for n in range(1, 12):
        for parts in range(1, 6):
            assert _uniform(n, parts) == partition_uniform(n, parts), (n, parts)
            for _ in range(3):
                weights = [rng.choice([0, 1, 1, 2, 5, 9]) for _ in range(n)]
                assert _spread_balanced(weights, parts) == [int(b) for b in partition_balanced(weights, parts)], (
                    weights, parts)


def splits(n, parts):
    """Every split of n items into `parts` contiguous non-empty stages, as boundaries."""
    for cuts in itertools.combinations(range(1, n), parts - 1):
        yield [0, *cuts, n]


def largest(bounds, of):
    """The largest stage sum of `of` under `bounds`."""
    return max(sum(of[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1))


def test_min_max_is_the_smallest_largest_stage():
    rng = random.Random(1)
    for n in range(1, 9):
        for parts in range(1, min(n, 4) + 1):
            values = [rng.randint(0, 9) for _ in range(n)]
            caps = [rng.randint(1, 5) for _ in range(n)]

            best = min(largest(b, values) for b in splits(n, parts))
            value, bounds = _min_max(values, parts)
            assert value == best == largest(bounds, values), (values, parts)
            limit = rng.randint(5, 15)
            allowed = [b for b in splits(n, parts) if largest(b, caps) <= limit]
            capped = _min_max(values, parts, cap=(caps, limit))
            if not allowed:
                assert capped is None
            else:
                assert capped[0] == min(largest(b, values) for b in allowed) == largest(capped[1], values)
                assert largest(capped[1], caps) <= limit


SHAPE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256)
CHOICES = "use type:transformer (the default), flops, uniform, parameters, type:REGEX"


@pytest.mark.parametrize("method,kw,line", [
    (None, {}, None), ("FLOPS", {}, None), ("Uniform", {}, None), ("parameters", {}, None),
    ("type:transformer", {}, None), ("type:embedding|transformer", {}, None),
    ("parameters", dict(embed_layernorm=True, pipeline_model_parallel_size=2),
     "--pp-partition-method parameters with --embed-layernorm at PP > 1 splits differently on different stages "
     "in DeepSpeed; use flops or type:transformer|embedding"),
    ("parameters", dict(embed_layernorm=True), None),
    ("type:(", {}, "--pp-partition-method type:(: not a regular expression (missing ), unterminated subpattern "
                   "at position 0)"),
    ("type:attention", {}, "--pp-partition-method type:attention matches none of the layers (EmbeddingPipe, "
                           "LayerNorm, ParallelTransformerLayerPipe); " + CHOICES),
    ("balanced", {}, "--pp-partition-method balanced is unknown; " + CHOICES),
])
def test_method_refusals_in_one_line(method, kw, line):
    """The method is checked when the shape is built (the vocab known): one line, or none."""
    if line is None:
        ModelShape(**SHAPE, **kw, pp_partition_method=method)
        return
    with pytest.raises(ConfigError) as refused:
        ModelShape(**SHAPE, **kw, pp_partition_method=method)
    assert str(refused.value) == line


def test_stage_descriptions():
    shape = ModelShape(**{**SHAPE, "num_layers": 8}, pipeline_model_parallel_size=2)
    assert [describe_stage(items, 8) for items in stage_items(shape)] == [
        "embedding, layers 1-4", "layers 5-8, norm, output layer"]
    shape = ModelShape(**{**SHAPE, "num_layers": 2}, pipeline_model_parallel_size=2)
    assert [describe_stage(items, 2) for items in stage_items(shape)] == ["embedding, layer 1",
                                                                          "layer 2, norm, output layer"]
