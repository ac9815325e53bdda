"""tools/convert_checkpoint_to_hf.py on every architecture it maps, each trained at a non-default
LayerNorm / RMSNorm epsilon: transformers' model computes our logits (our GPTModel built with the
epsilon the run was given, not the one the checkpoint records), and would not at the default
epsilon; and every variant that no target class represents (each condition of each target's match,
broken alone) is refused in one line, with the fields that differ from GPT-2 named, nothing written."""
import os

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY
from tests.support.tool_modules import load_tool

transformers = pytest.importorskip("transformers")

ROTARY = ["--use-rotary-position-embeddings", "--no-position-embedding"]
LLAMA = ROTARY + ["--swiglu", "--normalization", "rmsnorm", "--num-key-value-heads", 2,
                  "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
ALIBI = ["--position-embedding-type", "alibi", "--embed-layernorm"]
# name: (flags, epsilon, transformers class, its config's epsilon field, logits tolerance)
EXPORTS = {
    "gpt2": ([], 3e-3, "GPT2LMHeadModel", "layer_norm_epsilon", 1e-5),
    "llama": (LLAMA, 2e-3, "LlamaForCausalLM", "rms_norm_eps", 1e-5),
    # Qwen2's: LLaMA's block, tied, a bias on q, k and v only (zero at init: 3 iterations train it
    # away from zero, so logits without it differ)
    "qwen2": ([f for f in LLAMA if f != "--untie-embeddings-and-output-weights"] + ["--add-qkv-bias",
                                                                                  "--train-iters", 3], 3e-3,
              "Qwen2ForCausalLM", "rms_norm_eps", 1e-5),
    "neox": (ROTARY + ["--rotary-percent", 0.5, "--untie-embeddings-and-output-weights"], 4e-3,
             "GPTNeoXForCausalLM", "layer_norm_eps", 1e-5),
    # transformers' BLOOM: head dim 8 (48 / 6); its tanh GeLU against our exact one: ~1e-5 apart
    "bloom": (ALIBI + ["--hidden-size", 48, "--num-attention-heads", 6], 5e-3, "BloomForCausalLM",
              "layer_norm_epsilon", 1e-4),
    # issue 39's, converted exactly: layernorm-1p's stored gamma - 1 gets its 1 back (a forgotten 1
    # leaves gammas near 0), --openai-gelu is gelu_pytorch_tanh (BLOOM's own GeLU: now 1e-5),
    # --squared-relu is relu2
    "gpt2_1p_openai_gelu": (["--apply-layernorm-1p", "--openai-gelu"], 3e-3, "GPT2LMHeadModel", "layer_norm_epsilon",
                            1e-5),
    "llama_1p": (LLAMA + ["--apply-layernorm-1p"], 2e-3, "LlamaForCausalLM", "rms_norm_eps", 1e-5),
    "neox_squared_relu_1p": (ROTARY + ["--squared-relu", "--apply-layernorm-1p"], 4e-3, "GPTNeoXForCausalLM",
                             "layer_norm_eps", 1e-5),
    "bloom_openai_gelu": (ALIBI + ["--hidden-size", 48, "--num-attention-heads", 6, "--openai-gelu"], 5e-3,
                          "BloomForCausalLM", "layer_norm_epsilon", 1e-5),
}
# name: (flags, the variant fields that differ from GPT-2's, by hand, as the refusal names them)
REFUSED = {
    # LLaMA's match: rotary, RMSNorm, SwiGLU, no embedding LayerNorm, the whole head rotated
    "rotary_swiglu_layernorm": (ROTARY + ["--swiglu"], "position_embedding_type=rotary, glu_activation=swiglu"),
    "rotary_geglu_rmsnorm": (ROTARY + ["--glu-activation", "geglu", "--normalization", "rmsnorm"],
                             "position_embedding_type=rotary, glu_activation=geglu, normalization=rmsnorm"),
    "rotary_gelu_rmsnorm": (ROTARY + ["--normalization", "rmsnorm"],
                            "position_embedding_type=rotary, normalization=rmsnorm"),
    "llama_embed_layernorm": (ROTARY + ["--swiglu", "--normalization", "rmsnorm", "--embed-layernorm"],
                              "position_embedding_type=rotary, glu_activation=swiglu, normalization=rmsnorm, "
                              "embed_layernorm=True"),
    "llama_half_rotary": (ROTARY + ["--swiglu", "--normalization", "rmsnorm", "--rotary-percent", 0.5],
                          "position_embedding_type=rotary, rotary_percent=0.5, glu_activation=swiglu, "
                          "normalization=rmsnorm"),
    # GPT-NeoX's: rotary, LayerNorm, GeLU, biases, multi-head of dim h / a, no embedding LayerNorm
    "neox_no_bias": (ROTARY + ["--disable-bias-linear"], "position_embedding_type=rotary, add_bias_linear=False"),
    "neox_gqa": (ROTARY + ["--num-key-value-heads", 2], "position_embedding_type=rotary, num_key_value_heads=2"),
    "neox_kv_channels": (ROTARY + ["--kv-channels", 32], "position_embedding_type=rotary, kv_channels=32"),
    "neox_embed_layernorm": (ROTARY + ["--embed-layernorm"], "position_embedding_type=rotary, embed_layernorm=True"),
    # BLOOM's: ALiBi, embedding LayerNorm, LayerNorm, GeLU, biases, tied, multi-head of dim h / a
    "alibi_no_embed_layernorm": (["--position-embedding-type", "alibi"], "position_embedding_type=alibi"),
    "bloom_rmsnorm": (ALIBI + ["--normalization", "rmsnorm"],
                      "position_embedding_type=alibi, normalization=rmsnorm, embed_layernorm=True"),
    "bloom_geglu": (ALIBI + ["--glu-activation", "geglu"],
                    "position_embedding_type=alibi, glu_activation=geglu, embed_layernorm=True"),
    "bloom_no_bias": (ALIBI + ["--disable-bias-linear"],
                      "position_embedding_type=alibi, embed_layernorm=True, add_bias_linear=False"),
    "bloom_untied": (ALIBI + ["--untie-embeddings-and-output-weights"],
                     "position_embedding_type=alibi, embed_layernorm=True, untie_embeddings_and_output_weights=True"),
    "bloom_gqa": (ALIBI + ["--num-key-value-heads", 2],
                  "position_embedding_type=alibi, embed_layernorm=True, num_key_value_heads=2"),
    "bloom_kv_channels": (ALIBI + ["--kv-channels", 32],
                          "position_embedding_type=alibi, embed_layernorm=True, kv_channels=32"),
    # GPT-2's: learned positions and nothing else changed
    "gpt2_untied": (["--untie-embeddings-and-output-weights"], "untie_embeddings_and_output_weights=True"),
    "gpt2_rmsnorm": (["--normalization", "rmsnorm"], "normalization=rmsnorm"),
    "gpt2_geglu": (["--glu-activation", "geglu"], "glu_activation=geglu"),
    "gpt2_no_bias": (["--disable-bias-linear"], "add_bias_linear=False"),
    # Qwen2's QKV bias in a GPT-2 block
    "gpt2_qkv_bias": (["--disable-bias-linear", "--add-qkv-bias"], "add_bias_linear=False, add_qkv_bias=True"),
    "gpt2_gqa": (["--num-key-value-heads", 2], "num_key_value_heads=2"),
    "gpt2_embed_layernorm": (["--embed-layernorm"], "embed_layernorm=True"),
    "gpt2_kv_channels": (["--kv-channels", 32], "kv_channels=32"),
    "no_positions": (["--no-position-embedding"], "position_embedding_type=none"),
    # issue 39's: no target adds the norms' outputs (converter's UNREPRESENTED), in GPT-2's block and
    # in LLaMA's; BLOOM's GeLU is fixed
    "gpt2_post_ln": (["--apply-residual-connection-post-layernorm"], "apply_residual_connection_post_layernorm=True"),
    "llama_post_ln_1p": (LLAMA + ["--apply-residual-connection-post-layernorm", "--apply-layernorm-1p"],
                         "position_embedding_type=rotary, glu_activation=swiglu, normalization=rmsnorm, "
                         "add_bias_linear=False, num_key_value_heads=2, untie_embeddings_and_output_weights=True, "
                         "apply_residual_connection_post_layernorm=True"),
    "bloom_squared_relu": (ALIBI + ["--squared-relu"],
                           "position_embedding_type=alibi, embed_layernorm=True, activation=squared_relu"),
}
KNOWN = "GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM, BloomForCausalLM, Qwen2ForCausalLM"
TOKENS = torch.randint(0, 600, (2, 32), generator=torch.Generator().manual_seed(0))


def _flags(extra, save_dir, epsilon=None):
    argv = [str(a) for a in TINY + ["--global-batch-size", 2, "--train-iters", 1, "--eval-iters", 0,
                                    "--save", save_dir] + extra]
    for flag in ("--hidden-size", "--num-attention-heads"):  # BLOOM's sizes replace TINY's
        if argv.count(flag) == 2:
            i = argv.index(flag)
            del argv[i:i + 2]
    return argv + (["--layernorm-epsilon", str(epsilon)] if epsilon is not None else [])


def _save_all(root):
    """Each case trained one iteration and saved; our logits for the exported ones, from a GPTModel
    built with the epsilon given on the command line and the checkpoint's merged weights."""
    import contextlib
    import io

    import pretrain_gpt
    from megatron.checkpoint.reshard import Checkpoint, table_key
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    logits = {}
    for name, (extra, epsilon, *_) in {**EXPORTS, **{k: (v[0], None) for k, v in REFUSED.items()}}.items():
        with contextlib.redirect_stdout(io.StringIO()):
            pretrain_gpt.main(_flags(extra, os.path.join(root, name), epsilon))
        if name in EXPORTS:
            checkpoint = Checkpoint(os.path.join(root, name))
            model = GPTModel(GPTConfig(checkpoint.shape, layernorm_epsilon=epsilon, hidden_dropout=0.0,
                                       attention_dropout=0.0)).eval()
            full = checkpoint.read_weights()
            with torch.no_grad():
                for key, p in model.named_parameters():
                    p.copy_(full[table_key(key, checkpoint.shape, False)])
                logits[name] = model(TOKENS).transpose(0, 1).contiguous()
    return logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("checkpoints"))
    [logits] = run_distributed(1, _save_all, root)
    return root, logits


def _convert(capsys, *argv):
    """The converter's command line in this process: (exit code, stdout, stderr)."""
    code = 0
    try:
        load_tool("convert_checkpoint_to_hf").main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", EXPORTS)
def test_export_at_a_non_default_epsilon_computes_our_logits(saved, name, tmp_path, capsys):
    root, ours = saved
    _, epsilon, cls, field, tolerance = EXPORTS[name]
    code, out, err = _convert(capsys, "--load", os.path.join(root, name), "--output", tmp_path / "hf")
    assert code == 0, err
    assert f"to {cls} in" in out
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == cls and getattr(model.config, field) == epsilon
    with torch.no_grad():
        theirs = model(TOKENS).logits
    assert theirs.shape == ours[name].shape
    assert torch.allclose(theirs, ours[name], rtol=0, atol=tolerance), (theirs - ours[name]).abs().max()
    # the activation transformers runs is Megatron's (at this size erf and tanh GeLU differ by less
    # than the logits' tolerance): on a grid, against the formulas
    x = torch.linspace(-6, 6, 1201)
    act = transformers.activations.ACT2FN[getattr(model.config, "activation_function", None)
                                          or getattr(model.config, "hidden_act", None) or "gelu"]
    want = {"--openai-gelu": 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3))),
            "--squared-relu": torch.clamp(x, min=0) ** 2}
    for flag, values in want.items():
        if flag in EXPORTS[name][0] and cls != "BloomForCausalLM":  # BLOOM's GeLU is fixed: tanh
            torch.testing.assert_close(act(x), values, rtol=0, atol=1e-6)
    # the epsilon matters here: at the default the logits are far outside the tolerance
    default = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", **{field: 1e-5}).eval()
    with torch.no_grad():
        assert (default(TOKENS).logits - ours[name]).abs().max() > 100 * tolerance


@pytest.mark.parametrize("name", REFUSED)
def test_a_variant_no_target_represents_is_refused_in_one_line(saved, name, tmp_path, capsys):
    root, _ = saved
    load = os.path.join(root, name)
    code, out, err = _convert(capsys, "--load", load, "--output", tmp_path / "hf")
    assert code == 2 and "converted" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"convert_checkpoint_to_hf.py: error: {load}/global_step1: no transformers "
                               f"architecture maps the variant "), lines[0]
    assert lines[0].endswith(f" ({REFUSED[name][1]}; known: {KNOWN})"), lines[0]
    assert not os.path.exists(tmp_path / "hf")
