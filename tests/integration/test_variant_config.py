"""Variant flags (both forks' spellings) map to one ModelShape; bad combinations fail with one
line naming the flag; the counts follow from the parameter table and the FLOPs formula equals the
matmuls each variant really runs; old checkpoints
(written before variants existed) still load as GPT-2."""
import dataclasses
import json
import subprocess
import sys

import pytest

from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError
from tests.support.validated_args import validated
from tests.support.variants import VARIANTS, shape_kwargs

LLAMA_FLAGS = ["--use-rotary-position-embeddings", "--swiglu", "--normalization", "RMSNorm",
               "--num-key-value-heads", 2, "--untie-embeddings-and-output-weights", "--disable-bias-linear"]


def shape_of(*flags, world_size=1):
    return validated([*flags, "--tensor-model-parallel-size", world_size], world_size=world_size).model_shape


def test_both_forks_spellings_give_one_shape():
    microsoft = shape_of(*LLAMA_FLAGS, "--num-attention-heads", 8)
    assert microsoft == ModelShape(**{**shape_kwargs("llama"), "seq_length": 32, "vocab_size": 600,
                                      "num_layers": 4, "max_position_embeddings": 32})
    assert microsoft.ffn_hidden_size == int((4 * 64 * 2 / 3) / 64) * 64 == 128  # the Microsoft fork's default
    # BigScience's / Megatron-LM's spellings: --glu-activation keeps the 4h default, as BigScience's did
    other = shape_of("--position-embedding-type", "rope", "--glu-activation", "swiglu", "--normalization", "rmsnorm",
                     "--group-query-attention", "--num-query-groups", 2, "--num-attention-heads", 8,
                     "--untie-embeddings-and-output-weights", "--disable-bias-linear")
    assert other == ModelShape(**{**vars_of(microsoft), "swiglu": False, "ffn_hidden_size": 256})
    assert shape_of("--position-embedding-type", "learned_absolute").position_embedding_type == "absolute"
    assert shape_of("--no-position-embedding").position_embedding_type == "none"
    assert shape_of("--use-rotary-position-embeddings", "--no-position-embedding").position_embedding_type == "rotary"
    assert shape_of("--position-embedding-type", "alibi", "--no-position-embedding").position_embedding_type == "alibi"
    assert shape_of("--group-query-attention").num_key_value_heads == 1  # Megatron-LM's default: one group
    # Megatron-LM's --add-qkv-bias: a bias on QKV only, a change with --disable-bias-linear alone (the QKV
    # has its bias otherwise: one model, one checkpoint layout)
    assert shape_of("--add-qkv-bias") == shape_of()
    qkv_only = shape_of("--disable-bias-linear", "--add-qkv-bias")
    assert (qkv_only.add_bias_linear, qkv_only.add_qkv_bias) == (False, True)
    assert shape_of().num_key_value_heads == 4 and shape_of().kv_channels == 16
    assert shape_of("--hidden-size", 66, "--kv-channels", 16).kv_channels == 16
    for h in (4096, 5120, 8192, 100):
        assert ModelShape(num_layers=1, hidden_size=h, num_attention_heads=4, seq_length=8,
                          swiglu=True).ffn_hidden_size == int((4 * h * 2 / 3) / 64) * 64


def vars_of(shape):
    return {f: getattr(shape, f) for f in ModelShape.__dataclass_fields__}


@pytest.mark.parametrize("extra, world_size, message", [
    (["--num-key-value-heads", 3], 1, r"--num-key-value-heads 3 does not divide --num-attention-heads 4"),
    (["--num-key-value-heads", 1, "--tensor-model-parallel-size", 2], 2,
     r"--num-key-value-heads 1 is not divisible by --tensor-model-parallel-size 2: .*multi-query attention needs TP=1"),
    (["--swiglu", "--glu-activation", "geglu"], 1, r"--swiglu contradicts --glu-activation geglu"),
    (["--use-rotary-position-embeddings", "--position-embedding-type", "alibi"], 1,
     r"--use-rotary-position-embeddings contradicts --position-embedding-type alibi"),
    (["--no-position-embedding", "--position-embedding-type", "absolute"], 1,
     r"--no-position-embedding contradicts --position-embedding-type absolute"),
    (["--num-query-groups", 2], 1, r"--num-query-groups needs --group-query-attention"),
    (["--num-key-value-heads", 2, "--group-query-attention", "--num-query-groups", 4], 1,
     r"--num-key-value-heads 2 contradicts --num-query-groups 4"),
    (["--normalization", "batchnorm"], 1, r"--normalization batchnorm: choose layernorm or rmsnorm"),
    (["--kv-channels", 15, "--position-embedding-type", "rotary"], 1, r"--kv-channels 15 is odd"),
    (["--swiglu", "--hidden-size", 16], 1, r"--swiglu: the default ffn size .* is 0; pass --ffn-hidden-size"),
    (["--hidden-size", 66], 1,
     r"--hidden-size 66 is not divisible by --num-attention-heads 4: .* or give --kv-channels"),
    (["--kv-channels", 0], 1, r"--kv-channels 0 must be positive"),
])
def test_bad_variant_flags_fail_with_one_line(extra, world_size, message):
    with pytest.raises(ConfigError, match=message) as info:
        validated(extra, world_size)
    assert "\n" not in str(info.value)


def test_llama_count_by_hand():
    """Per layer: two RMSNorm weights 2h, QKV (a + 2g) d h, dense h a d, SwiGLU 3 f h (no biases);
    a final RMSNorm h; word embedding and untied output layer V h each."""
    shape = ModelShape(**shape_kwargs("llama"))
    L, h, a, g, d, f, V = 2, 64, 8, 2, 8, 128, 256
    assert (shape.num_key_value_heads, shape.kv_channels, shape.ffn_hidden_size) == (g, d, f)
    no_embedding = L * (2 * h + (a + 2 * g) * d * h + h * a * d + 3 * f * h) + h
    counts = analytic_parameter_counts(shape)
    assert counts.no_embedding == no_embedding == 69_952
    assert counts.total == no_embedding + 2 * V * h
    assert counts.components["output_layer"] == counts.components["word_embeddings"] == V * h
    # tying changes the total, not N: the output layer is the vocabulary projection
    tied = ModelShape(**shape_kwargs("llama", untie_embeddings_and_output_weights=False))
    assert analytic_parameter_counts(tied).no_embedding == no_embedding
    assert analytic_parameter_counts(tied).total == no_embedding + V * h


def test_llama2_70b_count_matches_the_published_number():
    """LLaMA-2-70B: 80 layers, h 8192, 64 query / 8 kv heads, ffn 28672, vocab 32000 (already a
    multiple of 128): 68,976,648,192 parameters, the count of its released weights."""
    out = subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "80", "--hidden-size", "8192",
                          "--num-attention-heads", "64", "--num-key-value-heads", "8", "--ffn-hidden-size", "28672",
                          "--seq-length", "4096", "--max-position-embeddings", "4096", "--vocab-size", "32000",
                          "--swiglu", "--use-rotary-position-embeddings", "--normalization", "rmsnorm",
                          "--untie-embeddings-and-output-weights", "--disable-bias-linear"],
                         capture_output=True, text=True, check=True).stdout
    assert "parameters: 68,976,648,192\n" in out
    assert "architecture: rotary, swiglu ffn 28672, rmsnorm, 64 query / 8 kv heads, untied, no bias\n" in out
    assert "  output_layer        | 262,144,000\n" in out and "position_embeddings" not in out


QWEN2_0_5B = ["--num-layers", "24", "--hidden-size", "896", "--num-attention-heads", "14", "--group-query-attention",
              "--num-query-groups", "2", "--ffn-hidden-size", "4864", "--seq-length", "4096",
              "--max-position-embeddings", "32768", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
              "--swiglu", "--disable-bias-linear", "--add-qkv-bias",
              # the tokenizer's 151,643 tokens padded to a multiple of 1187 (x TP 1): 151,936, the released rows
              "--vocab-size", "151643", "--make-vocab-size-divisible-by", "1187"]


def test_qwen2_0_5b_count_matches_transformers_and_the_published_number():
    """Qwen2-0.5B with Megatron-LM's flags (--disable-bias-linear --add-qkv-bias: a bias on QKV
    only): 494,032,768 parameters, the count of its released weights. By hand: h 896, 24 layers,
    14 query / 2 kv heads of dim 64, ffn 4864, vocab 151,936, tied:
      embedding 151,936 x 896 = 136,134,656
      per layer: QKV (14 + 2 x 2) x 64 x 896 = 1,032,192 + its bias 1,152; dense 896 x 896 = 802,816;
                 SwiGLU 3 x 896 x 4864 = 13,074,432; two RMSNorms 1,792 -> 14,912,384
      24 layers 357,897,216 + the final RMSNorm 896 = 357,898,112 without embeddings
    and independently from transformers' own Qwen2 built on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                      num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                                      tie_word_embeddings=True)
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    theirs = sum(p.numel() for p in model.parameters())  # the tied head once
    out = subprocess.run([sys.executable, "tools/param_count.py", *QWEN2_0_5B], capture_output=True, text=True,
                         check=True).stdout
    assert theirs == 494_032_768 == 136_134_656 + 357_898_112
    assert f"parameters: {theirs:,}\n" in out and "parameters without embeddings: 357,898,112\n" in out
    assert "padded vocab size: 151,936 (vocab 151,643, multiple of 1187 x TP 1)\n" in out
    assert "architecture: rotary, swiglu ffn 4864, rmsnorm, 14 query / 2 kv heads, tied, qkv bias only\n" in out
    # the bias is not a matmul: the FLOPs are the model's without it
    plain = subprocess.run([sys.executable, "tools/param_count.py", *(f for f in QWEN2_0_5B if f != "--add-qkv-bias")],
                           capture_output=True, text=True, check=True).stdout
    assert "parameters: 494,005,120\n" in plain  # 24 x 1,152 fewer
    flops = [line for line in out.splitlines() if "FLOPs" in line]
    assert flops and flops == [line for line in plain.splitlines() if "FLOPs" in line]


def _measured_flops(names):
    """FlopCounterMode on a real forward + backward of each variant's GPTModel ("math" attention
    spells QK^T and PV out as matmuls), batch 2."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    from tests.support.model_fixtures import tiny_batch
    out = {}
    for name in names:
        shape = ModelShape(**shape_kwargs(name, seq_length=48))
        config = GPTConfig(shape, hidden_dropout=0.0, attention_dropout=0.0, attention_impl="math")
        model = GPTModel(config).train()
        tokens, labels, loss_mask = tiny_batch(config, batch_size=2, seq_length=48)
        with FlopCounterMode(display=False) as counter:
            model(tokens, labels, loss_mask).backward()
        out[name] = counter.get_total_flops()
    return out


def test_flops_formula_equals_the_matmuls_each_variant_runs():
    """Measured, not read from the parameter table the formula reads: every variant's real
    forward + backward (GQA / MQA heads, GLU widths, head dims, untied output layer)."""
    from tests.support.distributed import run_distributed
    [measured] = run_distributed(1, _measured_flops, list(VARIANTS))
    for name in VARIANTS:
        shape = ModelShape(**shape_kwargs(name, seq_length=48))
        assert measured[name] == 2 * flops_per_sample(shape, False), name


def test_describe_and_report_name_the_variant():
    from megatron.utils import format_parameter_report
    descriptions = {name: ModelShape(**shape_kwargs(name)).describe() for name in VARIANTS}
    assert descriptions == {
        "gpt2": "learned positions, gelu ffn 256, layernorm, 8 heads, tied",
        "bloom": "alibi, gelu ffn 192, embed layernorm, layernorm, 6 heads, tied",
        "llama": "rotary, swiglu ffn 128, rmsnorm, 8 query / 2 kv heads, untied, no bias",
        "qwen2": "rotary, swiglu ffn 128, rmsnorm, 8 query / 2 kv heads, tied, qkv bias only",
        "mqa": "rotary, gelu ffn 256, layernorm, 8 query / 1 kv heads, tied",
        "kv_channels": "no positions, gelu ffn 256, layernorm, 8 query / 4 kv heads of dim 24, tied",
        "geglu_ffn100": "learned positions, geglu ffn 100, layernorm, 8 heads, tied",
        "reglu_embed_ln": "learned positions, reglu ffn 256, embed layernorm, rmsnorm, 8 heads, tied",
        "liglu_untied": "learned positions, liglu ffn 256, layernorm, 8 heads, untied, no bias",
        "post_ln_1p_squared_relu": "learned positions, squared_relu ffn 256, layernorm 1p, post-norm residuals, "
                                   "8 heads, tied",
        "openai_gelu_rmsnorm_1p": "learned positions, openai_gelu ffn 256, rmsnorm 1p, 8 heads, tied",
    }
    shape = ModelShape(**shape_kwargs("bloom"))
    lines = format_parameter_report(analytic_parameter_counts(shape), shape)
    assert "architecture: alibi, gelu ffn 192, embed layernorm, layernorm, 6 heads, tied" in lines
    assert "  embedding_layernorm | 96" in lines  # weight and bias, h 48
    assert not any("position_embeddings" in line or "output_layer" in line for line in lines)


def with_vocab(args, vocab=600):
    """As initialize_megatron completes the shape once the tokenizer is built (600 pads to 640)."""
    args.model_shape = dataclasses.replace(args.model_shape, vocab_size=vocab)  # args.padded_vocab_size follows
    return args


def test_the_layout_writes_add_qkv_bias_where_the_model_has_it():
    """Checkpoints of every other variant keep their files as they were (tests/unit/test_checkpoint_files.py
    reads them); a QKV-bias-only model's layout says so and reads back as that model."""
    from megatron.checkpoint.layout import CheckpointLayout
    plain = CheckpointLayout.from_shape(with_vocab(validated(["--disable-bias-linear"])).model_shape, True)
    qkv = CheckpointLayout.from_shape(with_vocab(validated(["--disable-bias-linear", "--add-qkv-bias"])).model_shape,
                                      True)
    assert "add_qkv_bias" not in plain.to_dict() and qkv.to_dict()["add_qkv_bias"] is True
    assert CheckpointLayout.from_dict(qkv.to_dict(), "here").model_shape().add_qkv_bias
    assert qkv.shape_differences(plain) == [("add_qkv_bias", True, False)]


def test_checkpoint_layout_names_the_variant_and_old_checkpoints_load_as_gpt2(tmp_path):
    from megatron.checkpoint.layout import LAYOUT_FILE as LAYOUT
    from tests.support.checkpoint_fixtures import checkpoint_manager
    gpt2 = with_vocab(validated())
    old = {key: getattr(gpt2, key) for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                                "padded_vocab_size", "max_position_embeddings",
                                                "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                "ds_pipeline_enabled")}
    (tmp_path / "global_step3").mkdir()
    (tmp_path / "global_step3" / LAYOUT).write_text(json.dumps(old))  # as written before variants existed
    # the shape check passes (an old layout is a GPT-2's); the next check reads the model shards,
    # which this layout-only checkpoint does not have
    with pytest.raises(ConfigError, match="mp_rank_00_model_states.pt: checkpoint shard is missing"):
        checkpoint_manager(gpt2).check_layout(str(tmp_path), 3)
    rotary = with_vocab(validated(["--use-rotary-position-embeddings"]))
    with pytest.raises(ConfigError, match=r"the checkpoint's model shape differs from this run's "
                                          r"\(position_embedding_type: saved absolute vs now rotary\)"):
        checkpoint_manager(rotary).check_layout(str(tmp_path), 3)
