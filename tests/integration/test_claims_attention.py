"""Self-attention of every position variant against attention written here in plain PyTorch
(float64, loops over heads, no project code in its math): ALiBi (its slopes and sign by hand),
rotary (pairs (j, j + d/2) rotated by p x theta^(-2j/d)), grouped-query and multi-query heads
(query head i reads key/value head i // (a/g)), the causal mask, the 1/sqrt(d) scale and the
fused QKV row layout (per kv group: its a/g query heads, its key head, its value head). Both the
"math" and the "sdpa" implementation must match. TP-vs-TP and sdpa-vs-math checks share this
math and cannot catch an error in it. A non-default --rotary-base goes through the flags, validation
and pretrain_gpt's model_provider, and its frequencies are checked by hand."""
import math

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_config

H, HEADS, S, B = 32, 4, 8, 2
D = H // HEADS
VARIANTS = {
    "alibi": dict(position_embedding_type="alibi"),
    "rotary_gqa": dict(position_embedding_type="rotary", num_key_value_heads=2),
    "rotary_mqa": dict(position_embedding_type="rotary", num_key_value_heads=1),
    "learned_gqa": dict(num_key_value_heads=2),
}
# ALiBi's slopes for 4 heads, by hand: a geometric sequence from 2^(-8/4), ratio 2^(-8/4)
ALIBI_SLOPES = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]


def _run_attention(names):
    from megatron.model.gpt_model import GPTModel
    out = {}
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(0))
    for name in names:
        for impl in ("math", "sdpa"):
            config = tiny_config(hidden_size=H, num_attention_heads=HEADS, seq_length=S, attention_impl=impl,
                                 **VARIANTS[name])
            model = GPTModel(config, seed=SEED).eval()
            attention = model.language_model.encoder.layers[0].self_attention
            with torch.no_grad():
                out[(name, impl)] = attention(x), {k: v.clone() for k, v in attention.state_dict().items()}
    return x, out


def _rotate(t, theta=10000.0):
    """t [heads, s, d]: channel pairs (j, j + d/2) rotated by position p x theta^(-2j/d)."""
    out = t.clone()
    for j in range(D // 2):
        angle = torch.arange(S, dtype=torch.float64) * theta ** (-2 * j / D)
        a, b = t[..., j], t[..., j + D // 2]
        out[..., j] = a * angle.cos() - b * angle.sin()
        out[..., j + D // 2] = b * angle.cos() + a * angle.sin()
    return out


def _reference(x, weights, variant):
    """[s, b, h] attention output of one layer, from its weights, in float64."""
    g = variant.get("num_key_value_heads", HEADS)
    per_group = HEADS // g
    w = {k: v.double() for k, v in weights.items()}
    qkv = torch.einsum("sbh,oh->sbo", x.double(), w["query_key_value.weight"]) + w["query_key_value.bias"]
    qkv = qkv.view(S, B, g, per_group + 2, D)  # per kv group: its query heads, then key, then value
    out = torch.zeros(S, B, HEADS * D, dtype=torch.float64)
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)
    for b in range(B):
        for i in range(HEADS):
            group = i // per_group
            q, k, v = qkv[:, b, group, i % per_group], qkv[:, b, group, per_group], qkv[:, b, group, per_group + 1]
            if variant.get("position_embedding_type") == "rotary":
                theta = variant.get("rope_theta", 10000.0)
                q, k = _rotate(q, theta), _rotate(k, theta)
            scores = q @ k.T / math.sqrt(D)  # [query position, key position]
            if variant.get("position_embedding_type") == "alibi":
                # the further back the key, the lower its score: -slope x (query pos - key pos)
                pos = torch.arange(S, dtype=torch.float64)
                scores = scores - ALIBI_SLOPES[i] * (pos[:, None] - pos[None, :])
            scores = scores.masked_fill(causal, float("-inf"))
            out[:, b, i * D:(i + 1) * D] = torch.softmax(scores, dim=-1) @ v
    return torch.einsum("sbo,ho->sbh", out, w["dense.weight"]) + w["dense.bias"]


@pytest.fixture(scope="module")
def attention_outputs():
    return run_distributed(1, _run_attention, list(VARIANTS))[0]


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("impl", ["math", "sdpa"])
def test_attention_equals_plain_pytorch(attention_outputs, name, impl):
    x, out = attention_outputs
    got, weights = out[(name, impl)]
    expected = _reference(x, weights, VARIANTS[name])
    assert torch.allclose(got.double(), expected, atol=1e-5, rtol=1e-4), (got.double() - expected).abs().max()


# --rotary-base 500 (Megatron-LM's spelling; --rotary-position-embeddings-theta is Microsoft's) on
# the rotary GQA model, built from the command line the way the trainer builds it; weights of std
# 0.5 so that the scores, and with them the positions, move the output well beyond the tolerance
ROTARY_BASE = dict(position_embedding_type="rotary", num_key_value_heads=2, rope_theta=500.0)
FLAGS = ["--num-layers", "2", "--hidden-size", str(H), "--num-attention-heads", str(HEADS), "--seq-length", str(S),
         "--max-position-embeddings", str(S), "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "128", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--no-pipeline-parallel", "--position-embedding-type", "rotary",
         "--num-key-value-heads", "2", "--rotary-base", "500", "--init-method-std", "0.5"]


def _run_attention_from_flags(impls):
    import pretrain_gpt
    from tests.support.validated_args import validated
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(0))
    out = {}
    for impl in impls:
        args = validated(["--attention-impl", impl], base=FLAGS)
        attention = pretrain_gpt.model_provider(args).eval().language_model.encoder.layers[0].self_attention
        with torch.no_grad():
            out[impl] = args.rope_theta, attention(x), {k: v.clone() for k, v in attention.state_dict().items()}
    return x, out


def test_rotary_base_frequencies_by_hand():
    """Channel pair (j, j + d/2) turns by p x base^(-2j/d): at base 500 and d 8 the pairs' rates
    are 1, 500^-1/4 = 0.2115, 500^-1/2 = 0.0447, 500^-3/4 = 0.00946 radians per position."""
    from megatron.model.positional_embeddings import rotary_tables
    cos, sin = rotary_tables(S, D, 500.0, "cpu")
    rates = [1.0, 0.21147425268811282, 0.044721359549995794, 0.009457416090031758]
    angles = torch.tensor([[p * r for r in rates] * 2 for p in range(S)], dtype=torch.float64)
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def flag_outputs():
    return run_distributed(1, _run_attention_from_flags, ["math", "sdpa"])[0]


@pytest.mark.parametrize("impl", ["math", "sdpa"])
def test_rotary_base_flag_reaches_the_model(flag_outputs, impl):
    x, out = flag_outputs
    theta, got, weights = out[impl]
    assert theta == 500.0
    expected = _reference(x, weights, ROTARY_BASE)
    assert torch.allclose(got.double(), expected, atol=1e-5, rtol=1e-4), (got.double() - expected).abs().max()
    # the default base's reference differs well beyond the tolerance: the base is what is tested
    default = _reference(x, weights, dict(ROTARY_BASE, rope_theta=10000.0))
    assert (got.double() - default).abs().max() > 1e-3
