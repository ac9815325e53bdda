"""The LLaMA-style example script trains on the bundled corpus at TP=2 x PP=2 and prints the exact
count of its variant (derived here by hand); the BLOOM-style one's flags give its count by hand."""
import pytest

from tests.support.example_runs import run_example

L, H, HEADS, V = 4, 128, 8, 8192  # both scripts; the bundled vocab is already a multiple of 128 x 2


def llama_counts():
    """Per layer: two RMSNorm weights, QKV (a + 2g) d h with 2 kv heads, dense h a d, SwiGLU 3fh
    with f = int(8h/3/64)*64 = 320; final RMSNorm; word embedding and untied output layer."""
    d, g, f = H // HEADS, 2, 320
    no_embedding = L * (2 * H + (HEADS + 2 * g) * d * H + H * HEADS * d + 3 * f * H) + H
    return no_embedding + 2 * V * H, no_embedding


def bloom_counts():
    """GPT-2 blocks L (12h^2 + 13h), final LayerNorm 2h, the embedding LayerNorm 2h (a norm: in N),
    no position table (ALiBi), the tied word embedding Vh."""
    no_embedding = L * (12 * H * H + 13 * H) + 2 * H + 2 * H
    return no_embedding + V * H, no_embedding


@pytest.mark.parametrize("script, counts, architecture", [
    ("pretrain_gpt_llama_cpu.sh", llama_counts,
     "rotary, swiglu ffn 320, rmsnorm, 8 query / 2 kv heads, untied, no bias"),
    # the BLOOM-style example is the same quickstart wrapper; its variant trains at TP2 x PP2 in
    # tests/integration/test_variant_launches.py, so only its count is derived here (test_bloom_example_count)
])
def test_variant_example_trains_and_prints_its_exact_count(script, counts, architecture, tmp_path):
    out = run_example(script, tmp_path, "--log-interval", "1", "--eval-interval", "2", TRAIN_ITERS=2)
    total, no_embedding = counts()
    assert f"model parameters (exact): {total:,} total, {no_embedding:,} without embeddings (TP=2 PP=2" in out
    assert f"architecture: {architecture}\n" in out
    assert "disagrees with the analytic formula" not in out
    assert " iteration        2/       2 |" in out and " validation loss at iteration 2 |" in out


def test_bloom_example_count():
    """The BLOOM-style example's shape through tools/param_count.py, against the count by hand."""
    import re
    import subprocess
    import sys
    with open("examples/pretrain_gpt_bloom_cpu.sh") as f:
        variant = re.search(r"pretrain_gpt_tiny_cpu.sh (.*) \"\$@\"", f.read()).group(1).split()
    flags = ["--num-layers", L, "--hidden-size", H, "--seq-length", 128, "--vocab-file", "data/gpt2-vocab.json",
             "--tensor-model-parallel-size", 2, "--pipeline-model-parallel-size", 2, *variant]
    out = subprocess.run([sys.executable, "tools/param_count.py", *map(str, flags)], capture_output=True, text=True,
                         check=True).stdout
    total, no_embedding = bloom_counts()
    assert f"parameters: {total:,}\nparameters without embeddings: {no_embedding:,}\n" in out
    assert "architecture: alibi, gelu ffn 512, embed layernorm, layernorm, 8 heads, tied\n" in out
