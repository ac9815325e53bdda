"""The pipeline split's rules against independent references (survivors of the mutation run,
benchmarks/mutation.sh): DeepSpeed's own partition_uniform / partition_balanced for its methods,
a brute force over every contiguous split for ours (min-max, with a cap), the one-line refusals
of --pp-partition-method, and the stage descriptions. In-process."""
import itertools
import random

import pytest
from deepspeed.runtime.utils import partition_balanced, partition_uniform

from megatron.model.analytic import stage_items
from megatron.model.partition import (
    TRANSFORMER_ITEM,
    PipeItem,
    _min_max,
    _spread_balanced,
    _uniform,
    describe_stage,
    split_items,
)
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError


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


def test_min_max_ties_go_to_the_earlier_cut():
    """Among splits with the same largest stage, the later stages take the extra items (the first
    stage already holds the most micro-batches in flight in 1F1B). By hand: 5 equal items on 2
    stages, 2 + 3 (not 3 + 2); 7 on 3 stages, 2 + 2 + 3; the same under a cap that both allow;
    and through split_items' flops method: 7 layers of 10 FLOPs on 3 stages, at most 30 each; with
    no parameters every split within that ties, so from the end each stage takes all it may:
    1 + 3 + 3."""
    assert _min_max([1] * 5, 2) == (3, [0, 2, 5])
    assert _min_max([1] * 7, 3) == (3, [0, 2, 4, 7])
    assert _min_max([1] * 5, 2, cap=([1] * 5, 3)) == (3, [0, 2, 5])
    items = [PipeItem(TRANSFORMER_ITEM, i + 1, 0, 10) for i in range(7)]
    assert split_items(items, 3, "flops") == (0, 1, 4, 7)
    # a cap reached exactly is allowed (<=): 3 items of cap 1 under 2, either 1 + 2 or 2 + 1
    assert _min_max([1, 1, 1], 2, cap=([1, 1, 1], 2)) == (2, [0, 1, 3])
    # items of no weight at all (the MoE loss function's parameters): the largest stage holds 0
    assert _min_max([0, 0, 0], 2) == (0, [0, 1, 3])


def test_parameters_method_is_deepspeeds_partition_balanced():
    """--pp-partition-method parameters (any case) splits the items' parameter counts as DeepSpeed's
    partition_balanced does: a large embedding, 6 layers, a norm, the tied output copy (no params)."""
    params = [600, 90, 110, 90, 110, 90, 110, 4, 0]
    items = [PipeItem(TRANSFORMER_ITEM if 0 < i < 7 else "X", i, p, 1) for i, p in enumerate(params)]
    for parts in (2, 3, 4):
        expected = tuple(int(b) for b in partition_balanced(params, parts))
        assert split_items(items, parts, "Parameters") == expected, parts
