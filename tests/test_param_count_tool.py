"""tools/param_count.py: exact counts from flags alone, equal to the built model's."""
import subprocess
import sys

import pytest

from distributed import run_distributed
from megatron.utils import analytic_parameter_counts, partition_layers


def run_tool(*flags):
    proc = subprocess.run([sys.executable, "tools/param_count.py", *map(str, flags)], capture_output=True,
                          text=True, timeout=60, check=True)
    return proc.stdout


def test_104b_model_from_the_seed_discussion():
    """64 layers, hidden 11600, seq 2048, vocab 50257 padded to 50304:
    64 (12 h^2 + 13 h) + 2h without embeddings; plus (50304 + 2048) h with them."""
    out = run_tool("--num-layers", 64, "--hidden-size", 11600, "--num-attention-heads", 80, "--seq-length", 2048,
                   "--vocab-size", 50257)
    h = 11600
    assert 64 * (12 * h * h + 13 * h) + 2 * h == 103_351_754_400
    assert "parameters: 103,959,037,600\n" in out
    assert "parameters without embeddings: 103,351,754,400\n" in out
    assert "estimated model parameters: 103.9590376\n" in out


def test_vocab_file_and_per_stage_split():
    out = run_tool("--num-layers", 8, "--hidden-size", 512, "--num-attention-heads", 8, "--seq-length", 1024,
                   "--vocab-file", "data/gpt2-vocab.json", "--pipeline-model-parallel-size", 3,
                   "--global-batch-size", 16, "--checkpoint-activations")
    # the bundled vocab has 8192 entries: already a multiple of 128
    assert "padded vocab size: 8,192 (vocab 8,192" in out
    assert partition_layers(8, 3) == [3, 3, 2]
    per_layer = 12 * 512 * 512 + 13 * 512
    embeddings = 8192 * 512 + 1024 * 512
    assert f"    0 |                  3 | {embeddings + 3 * per_layer:,}" in out
    assert f"    2 |                  2 | {2 * per_layer + 2 * 512:,}" in out
    assert "FLOPs per iteration (global batch 16)" in out


def test_unknown_flags_are_ignored_so_launch_scripts_paste_in():
    out = run_tool("--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
                   "--vocab-size", 600, "--fp16", "--zero-stage", 1, "--lr", "1e-4")
    assert "parameters: 143,104\n" in out  # 640*64 + 32*64 + 2*(12*64^2 + 13*64) + 2*64


def _built_count(config_kwargs, pp):
    import argparse
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.utils import compute_parameter_counts
    config = GPTConfig(**config_kwargs)
    args = argparse.Namespace(num_layers=config.num_layers, hidden_size=config.hidden_size,
                              ffn_hidden_size=config.ffn_hidden_size, seq_length=config.max_position_embeddings,
                              max_position_embeddings=config.max_position_embeddings,
                              padded_vocab_size=config.padded_vocab_size, pipeline_model_parallel_size=pp,
                              checkpoint_activations=False)
    compute_parameter_counts(GPTModelPipe(config, mpu.get_topology()), args, mpu)
    return args.parameters, args.parameters_no_embedding, [owned for _, _, owned in args.parameter_stages]


@pytest.mark.parametrize("config, pp", [
    (dict(num_layers=3, hidden_size=48, num_attention_heads=6, padded_vocab_size=384, max_position_embeddings=40,
          ffn_hidden_size=100), 2),
    (dict(num_layers=5, hidden_size=32, num_attention_heads=2, padded_vocab_size=256, max_position_embeddings=16), 2),
])
def test_formula_equals_built_model(config, pp):
    [(total, no_embedding, stages), _] = run_distributed(pp, _built_count, config, pp, pp=pp)
    expected = analytic_parameter_counts(config["num_layers"], config["hidden_size"],
                                         config.get("ffn_hidden_size") or 4 * config["hidden_size"],
                                         config["padded_vocab_size"], config["max_position_embeddings"], pp)
    assert (total, no_embedding, stages) == (expected["total"], expected["no_embedding"], expected["stages"])
