"""tools/param_count.py: exact counts from flags alone, equal to the built model's."""
import importlib.util
import os
import subprocess
import sys

import pytest

from megatron.model.analytic import analytic_parameter_counts
from megatron.model.shape import ModelShape
from tests.support.distributed import run_distributed


def run_tool(*flags):
    # this checkout's megatron (not the one `pip install -e` registered) for the tool's imports
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    proc = subprocess.run([sys.executable, "tools/param_count.py", *map(str, flags)], capture_output=True,
                          text=True, timeout=60, check=True, env=env)
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
                   "--global-batch-size", 16, "--checkpoint-activations", "--pp-partition-method", "flops")
    # the bundled vocab has 8192 entries: already a multiple of 128
    assert "padded vocab size: 8,192 (vocab 8,192" in out
    # the flops split balances FLOPs: a layer 24 s h^2 + 4 s^2 h = 8,589,934,592 forward, the
    # logits 2 s h V = 8,589,934,592 too: 9 equal units over 3 stages, 3 + 3 + (2 layers + logits)
    assert "      2 | layers 7-8, norm, output layer " in out
    per_layer = 12 * 512 * 512 + 13 * 512
    embeddings = 8192 * 512 + 1024 * 512
    # stage | layers | held by TP rank 0 | owned: the last stage also holds the tied embedding copy
    assert f"      0 |      3 | {embeddings + 3 * per_layer:20,} | {embeddings + 3 * per_layer:,}\n" in out
    assert f"      2 |      2 | {embeddings + 2 * per_layer + 2 * 512:20,} | {2 * per_layer + 2 * 512:,}\n" in out
    assert "FLOPs per iteration (global batch 16)" in out


def test_unknown_flags_are_ignored_so_launch_scripts_paste_in():
    out = run_tool("--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
                   "--vocab-size", 600, "--fp16", "--zero-stage", 1, "--lr", "1e-4")
    assert "parameters: 143,104\n" in out  # 640*64 + 32*64 + 2*(12*64^2 + 13*64) + 2*64


def test_flags_the_trainer_does_not_know_are_named_in_one_line():
    """The trainer's flags the tool does not read (--lr, --save, DeepSpeed's) pass silently; flags
    pretrain_gpt.py does not know either (Megatron-LM's --qk-layernorm changes the model) are named,
    values left out, in one line on stderr; the report is the one without them."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "600"]
    known = ["--lr", "1e-4", "--save", "ckpt", "--deepspeed", "--deepspeed_config", "ds.json", "--log-interval", "1"]
    unknown = ["--qk-layernorm", "--use-mcore-models", "--ckpt-format", "torch_dist",
               "--no-rope-fusion=1"]

    def tool(*flags):
        return subprocess.run([sys.executable, "tools/param_count.py", *model, *flags], capture_output=True,
                              text=True, timeout=60, check=True, env=env)
    plain, with_known, with_unknown = tool(), tool(*known), tool(*known, *unknown)
    assert plain.stdout == with_known.stdout == with_unknown.stdout and "parameters: 143,104\n" in plain.stdout
    assert plain.stderr == with_known.stderr == ""
    assert with_unknown.stderr == ("param_count.py: ignored, not flags of pretrain_gpt.py (the numbers are for the "
                                   "model without them): --qk-layernorm, --use-mcore-models, "
                                   "--ckpt-format, --no-rope-fusion\n")


def test_the_tools_list_of_deepspeeds_flags_is_deepspeeds():
    import argparse

    import deepspeed
    spec = importlib.util.spec_from_file_location("param_count", os.path.join("tools", "param_count.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser(add_help=False))
    assert {o: (0 if a.nargs == 0 else 1) for a in parser._actions for o in a.option_strings} == tool.DEEPSPEED_FLAGS


@pytest.mark.parametrize("flags, message", [
    (["--vocab-file", "README.md"], "param_count.py: error: --vocab-file README.md: not a GPT-2 vocab.json ("),
    (["--vocab-size", 600, "--global-batch-size", 0], "param_count.py: error: --global-batch-size 0 must be positive"),
    (["--vocab-size", 0], "param_count.py: error: --vocab-size 0 must be positive"),
    (["--vocab-size", 600, "--global-batch-size", 16, "--rampup-batch-size", 32, 8, 100],
     "param_count.py: error: --rampup-batch-size: start batch 32 exceeds --global-batch-size 16"),
])
def test_bad_input_is_one_line_with_the_trainers_rules(flags, message):
    """The trainer's checks (megatron.config.validation.validate_flag_values / validate_rampup, ModelShape)."""
    proc = subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "2", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "32", *map(str, flags)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(message), line


def _built_count(shape):
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.utils import compute_parameter_counts
    return compute_parameter_counts(GPTModelPipe(GPTConfig(shape), mpu.get_topology()), mpu, shape)


@pytest.mark.parametrize("shape", [
    dict(num_layers=3, hidden_size=48, num_attention_heads=6, vocab_size=384, seq_length=32,
         max_position_embeddings=40, ffn_hidden_size=100, pipeline_model_parallel_size=2),
    dict(num_layers=5, hidden_size=32, num_attention_heads=2, vocab_size=256, seq_length=16,
         pipeline_model_parallel_size=2),
])
def test_formula_equals_built_model(shape):
    shape = ModelShape(**shape)
    built = run_distributed(2, _built_count, shape, pp=2)
    assert built[0] == built[1] == analytic_parameter_counts(shape)  # components, per-stage held and owned


def test_memory_table_from_layout_precision_zero_and_batch_flags():
    """The tool's memory table follows its layout, precision and ZeRO flags: the state columns by
    hand (the trainer's prediction is checked against real engines in tests/integration/test_memory_measured.py);
    and it stays torch-free."""
    flags = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "600", "--pipeline-model-parallel-size", "2", "--num-gpus", "4", "--zero-stage", "1",
             "--bf16", "--micro-batch-size", "2", "--global-batch-size", "16", "--checkpoint-activations"]
    out = run_tool(*flags)
    assert "memory per rank (predicted; bf16, ZeRO 1, DeepSpeedZeroOptimizer, DP=2, micro batch 2 x 4" in out
    # by hand, h 64, vocab 600 -> 640: stage 0 holds the embedding (640 + 32) x 64 and layers 1-2
    # (12 h^2 matrices + 13 h vectors each); stage 1 layers 3-4, the final LayerNorm 2h and the tied
    # embedding copy. bf16 weights 2 bytes; ZeRO 1 over DP 2: fp32 master, m and v (12 bytes) of half
    # of each of the two groups, one 4-byte step per group; gradients (2 bytes) of the whole tensors
    # overlapping DP rank 1's half: layer 1's h->4h and 4h->h, all of layer 2 (matrices 70,656 ..
    # 141,312; vectors 832 .. 1,664 = layer 2's)
    layer_matrices, layer_vectors, embedding = 12 * 64 * 64, 13 * 64, (640 + 32) * 64
    stage0 = embedding + 2 * (layer_matrices + layer_vectors)
    stage1 = 2 * (layer_matrices + layer_vectors) + 2 * 64 + embedding
    rank1_grads = 2 * (8 * 64 * 64 + layer_matrices + layer_vectors)
    assert f"      0 |       1 | {2 * stage0:15,} | {rank1_grads:15,} | {12 * stage0 // 2 + 8:15,} |" in out
    assert f"      1 |       1 | {2 * stage1:15,} |" in out
    assert f" | {12 * stage1 // 2 + 8:15,} |" in out
    probe = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['param_count.py'] + sys.argv[1:]; "
                            "runpy.run_path('tools/param_count.py', run_name='__main__'); "
                            "assert 'torch' not in sys.modules, 'the tool imported torch'"] + flags,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    bad = subprocess.run([sys.executable, "tools/param_count.py", *flags[:12], "--num-gpus", "3"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--world-size 3 is not divisible by TP x PP = 2" in bad.stderr
