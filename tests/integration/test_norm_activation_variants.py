"""The init, activation and norm variants of both forks (issue 39): each one's forward against a
plain-PyTorch GPT written here with the same weights (post-layernorm residuals, layernorm-1p,
OpenAI's tanh GeLU, squared ReLU); --init-method-xavier-uniform's bounds and variance; the dtypes
of --fp32-residual-connection and of the attention softmax under bf16 on CPU; the flag rules. The
counts at TP2 x PP2 and the FLOPs of the variants that are model shapes run in test_variants.py
(tests/support/variants.py)."""
import math

import pytest
import torch

from megatron.model.analytic import analytic_parameter_counts
from megatron.runtime.refusal import ConfigError
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config
from tests.support.validated_args import validated

EPS = 1e-5
TOLERANCE = 2e-5  # fp32 logits of size ~5: the two implementations' rounding
# name: shape fields (on tiny_config's 2 layers, h 32, 4 heads)
CASES = {
    "gpt2": {},
    "post_ln": {"apply_residual_connection_post_layernorm": True},
    "layernorm_1p": {"apply_layernorm_1p": True},
    "rmsnorm_1p": {"apply_layernorm_1p": True, "normalization": "rmsnorm"},
    "openai_gelu": {"activation": "openai_gelu"},
    "squared_relu": {"activation": "squared_relu"},
    "post_ln_1p_squared_relu": {"apply_residual_connection_post_layernorm": True, "apply_layernorm_1p": True,
                                "activation": "squared_relu"},
}


# --- the plain implementation: nothing of megatron.model below --------------------------------
ACTIVATIONS = {"gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
               "openai_gelu": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
               "squared_relu": lambda x: torch.clamp(x, min=0) ** 2}


def _norm(p, prefix, x, fields):
    gamma = p[prefix + "weight"] + (1 if fields.get("apply_layernorm_1p") else 0)
    if fields.get("normalization") == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * gamma
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + EPS) * gamma + p[prefix + "bias"]


def plain_logits(p, fields, tokens, layers=2, heads=4):
    """[b, s, V]: GPT-2 with learned positions, per-head fused QKV rows (q, k, v of each head)."""
    post_ln, act = fields.get("apply_residual_connection_post_layernorm"), ACTIVATIONS[fields.get("activation",
                                                                                                   "gelu")]
    b, s = tokens.shape
    x = p["language_model.embedding.word_embeddings.weight"][tokens] + \
        p["language_model.embedding.position_embeddings.weight"][:s]
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    for i in range(layers):
        w = {k[len(f"language_model.encoder.layers.{i}."):]: v for k, v in p.items()
             if k.startswith(f"language_model.encoder.layers.{i}.")}
        n1 = _norm(w, "input_layernorm.", x, fields)
        q, k, v = (n1 @ w["self_attention.query_key_value.weight"].T + w["self_attention.query_key_value.bias"]) \
            .view(b, s, heads, 3, -1).unbind(3)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.size(-1))
        probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        context = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1)
        attn = context @ w["self_attention.dense.weight"].T + w["self_attention.dense.bias"]
        x = (n1 if post_ln else x) + attn
        n2 = _norm(w, "post_attention_layernorm.", x, fields)
        mlp = act(n2 @ w["mlp.dense_h_to_4h.weight"].T + w["mlp.dense_h_to_4h.bias"]) @ w["mlp.dense_4h_to_h.weight"].T
        x = (n2 if post_ln else x) + mlp + w["mlp.dense_4h_to_h.bias"]
    x = _norm(p, "language_model.encoder.final_layernorm.", x, fields)
    return x @ p["language_model.embedding.word_embeddings.weight"].T


# --- in a worker ---------------------------------------------------------------------------------
def _forwards(cases):
    from megatron.model.gpt_model import GPTModel
    out = {}
    for name, fields in cases.items():
        config = tiny_config(**fields)
        model = GPTModel(config, seed=SEED).eval()
        initial_norm = model.language_model.encoder.layers[0].input_layernorm.weight.detach().clone()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # every weight random, norms and biases included: each one matters
            for param in model.parameters():
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
            tokens, _, _ = tiny_batch(config)
            logits = model(tokens).transpose(0, 1)
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        out[name] = (logits, params, tokens, initial_norm, sum(p.numel() for p in model.parameters()))
    return out


def test_each_variant_equals_the_plain_implementation_and_keeps_the_count():
    [out] = run_distributed(1, _forwards, CASES)
    for name, fields in CASES.items():
        logits, params, tokens, initial_norm, numel = out[name]
        torch.testing.assert_close(logits, plain_logits(params, fields, tokens), rtol=0, atol=TOLERANCE, msg=name)
        # none of them adds or drops a parameter (layernorm-1p stores gamma - 1 in the same tensor):
        # the count of the same norm without the variant, by the plain implementation's tensors
        plain = tiny_config(**{k: v for k, v in fields.items() if k == "normalization"}).shape
        assert numel == sum(p.numel() for p in params.values()) == analytic_parameter_counts(plain).total, name
        assert analytic_parameter_counts(tiny_config(**fields).shape) == analytic_parameter_counts(plain), name
        # gamma starts at 1: stored as 1, or as 0 with layernorm-1p
        assert torch.equal(initial_norm, torch.full_like(initial_norm, 0.0 if "1p" in name else 1.0)), name
    # the variants do differ: the same weights give other logits without the variant
    for name, fields in CASES.items():
        if name != "gpt2":
            without = {k: v for k, v in fields.items() if k == "normalization"}
            gap = (out[name][0] - plain_logits(out[name][1], without, out[name][2])).abs().max()
            assert gap > 10 * TOLERANCE, (name, gap)


def _xavier_weights(xavier):
    from megatron.model.gpt_model import GPTModel
    model = GPTModel(tiny_config(init_method_xavier_uniform=xavier, num_layers=2, hidden_size=64,
                                 num_attention_heads=4, untie_embeddings_and_output_weights=True), seed=SEED)
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.dim() == 2}


def test_xavier_uniform_draws_every_matrix_from_its_bounds():
    """torch.nn.init.xavier_uniform_: U(-b, b), b = sqrt(6 / (fan_in + fan_out)) of the whole matrix
    (fan_in: columns, fan_out: rows), variance b^2 / 3; seed 1234, each matrix >= 2048 values."""
    [weights] = run_distributed(1, _xavier_weights, True)
    [normal] = run_distributed(1, _xavier_weights, False)
    assert len(weights) == 11  # word and position embeddings, 4 per layer, the untied output layer
    for name, w in weights.items():
        rows, cols = w.shape
        bound = math.sqrt(6.0 / (rows + cols))
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound, name
        assert w.var().item() == pytest.approx(bound ** 2 / 3, rel=0.1), name
        assert w.mean().abs().item() < 0.1 * bound, name
        # the default draws N(0, 0.02) (std / sqrt(2 L) for dense and dense_4h_to_h): not these
        assert normal[name].var().item() < 0.5 * bound ** 2 / 3, name


def _dtypes(cases):
    from torch.overrides import TorchFunctionMode

    from megatron.model.gpt_model import GPTModel
    from megatron.model.transformer import ParallelTransformerLayer

    class Record(TorchFunctionMode):  # records what runs; changes nothing
        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in ("softmax", "scaled_dot_product_attention"):
                seen.append((name, result.dtype))
            return result

    out = {}
    for name, fields in cases.items():
        model = GPTModel(tiny_config(params_dtype=torch.bfloat16, **fields), seed=SEED).to(torch.bfloat16)
        layer_out, seen = [], []
        for module in model.modules():
            if isinstance(module, ParallelTransformerLayer):
                module.register_forward_hook(lambda m, i, o, seen=layer_out: seen.append((i[0].dtype, o.dtype)))
        tokens, _, _ = tiny_batch(tiny_config())
        with Record():
            logits = model(tokens)
        out[name] = {"layers": layer_out, "softmax": seen[:4], "logits": logits.dtype}
    return out


def test_fp32_residual_and_softmax_dtypes_under_bf16():
    cases = {"bf16": {}, "fp32_residual": {"fp32_residual_connection": True},
             "bf16_softmax": {"attention_softmax_in_fp32": False},
             "fp32_softmax_math": {"attention_impl": "math"},
             "bf16_softmax_math": {"attention_softmax_in_fp32": False, "attention_impl": "math"}}
    [out] = run_distributed(1, _dtypes, cases)
    bf16, f32 = torch.bfloat16, torch.float32
    assert out["bf16"]["layers"] == [(bf16, bf16)] * 2
    # the residual stream is fp32 from the embedding on; the norms hand the layers bf16; logits bf16
    assert out["fp32_residual"]["layers"] == [(f32, f32)] * 2
    assert out["fp32_residual"]["logits"] == bf16 and out["bf16"]["logits"] == bf16
    # sdpa's kernels accumulate in fp32 whatever the flag; the math path is Megatron's unfused softmax
    assert out["bf16"]["softmax"] == out["bf16_softmax"]["softmax"] == [("scaled_dot_product_attention", bf16)] * 2
    assert out["fp32_softmax_math"]["softmax"] == [("softmax", f32)] * 2
    assert out["bf16_softmax_math"]["softmax"] == [("softmax", bf16)] * 2


def test_flags_give_the_variants_and_their_rules():
    from megatron.model.config import GPTConfig
    from megatron.runtime.precision import softmax_in_fp32
    args = validated(["--apply-residual-connection-post-layernorm", "--apply-layernorm-1p", "--squared-relu",
                      "--init-method-xavier-uniform", "--bf16", "--fp32-residual-connection"])
    shape = args.model_shape
    assert (shape.apply_residual_connection_post_layernorm, shape.apply_layernorm_1p, shape.activation) == (
        True, True, "squared_relu")
    assert shape.describe() == ("learned positions, squared_relu ffn 256, layernorm 1p, post-norm residuals, "
                                "4 heads, tied")
    config = GPTConfig.from_args(args)
    assert config.init_method_xavier_uniform and config.fp32_residual_connection
    assert validated(["--openai-gelu"]).model_shape.activation == "openai_gelu"
    # Megatron-DeepSpeed: query-key layer scaling is on by default and forces an fp32 softmax
    for flags, fp32 in (([], True), (["--no-query-key-layer-scaling"], False),
                        (["--no-query-key-layer-scaling", "--attention-softmax-in-fp32"], True),
                        (["--apply-query-key-layer-scaling"], True)):
        assert softmax_in_fp32(validated(flags)) is fp32, flags
    for flags, message in (
            (["--fp32-residual-connection"], "--fp32-residual-connection needs --fp16 or --bf16: in fp32 the "
                                             "residual stream is fp32 already; drop the flag"),
            (["--openai-gelu", "--squared-relu"], "--openai-gelu contradicts --squared-relu: choose one activation"),
            (["--squared-relu", "--swiglu"], "--squared-relu contradicts --glu-activation swiglu (--swiglu): a GLU "
                                             "has its own activation; drop one of them"),
            (["--apply-query-key-layer-scaling", "--no-query-key-layer-scaling"],
             "--apply-query-key-layer-scaling contradicts --no-query-key-layer-scaling: drop one")):
        with pytest.raises(ConfigError) as refused:
            validated(flags)
        assert str(refused.value) == message


def test_the_layout_records_the_variants_and_refuses_another():
    """megatron_layout.json: the variant keys are written where the model has them (a GPT-2's file
    stays as it was) and read back; another variant's checkpoint differs in exactly those keys."""
    import dataclasses

    from megatron.checkpoint.layout import CheckpointLayout

    def layout(flags):
        shape = dataclasses.replace(validated(flags).model_shape, vocab_size=600)
        return CheckpointLayout.from_shape(shape, True)
    plain = layout([])
    variant = layout(["--apply-residual-connection-post-layernorm", "--apply-layernorm-1p", "--openai-gelu"])
    saved = variant.to_dict()
    assert not {"activation", "apply_layernorm_1p", "apply_residual_connection_post_layernorm"} & set(plain.to_dict())
    assert (saved["activation"], saved["apply_layernorm_1p"], saved["apply_residual_connection_post_layernorm"]) == (
        "openai_gelu", True, True)
    back = CheckpointLayout.from_dict(saved, "here").model_shape()
    assert (back.activation, back.apply_layernorm_1p, back.apply_residual_connection_post_layernorm) == (
        "openai_gelu", True, True)
    assert variant.shape_differences(plain) == [("activation", "openai_gelu", "gelu"),
                                                ("apply_residual_connection_post_layernorm", True, False),
                                                ("apply_layernorm_1p", True, False)]



VARIANT_FLAGS = ["--apply-residual-connection-post-layernorm", "--apply-layernorm-1p", "--squared-relu",
                 "--init-method-xavier-uniform", "--fp32-residual-connection", "--no-query-key-layer-scaling",
                 "--attention-impl", "math"]


def test_bf16_pp2_launch_with_the_variants_counts_trains_and_refuses_another_variant(tmp_path):
    """deepspeed, 2 ranks at PP=2, --bf16 with ZeRO 1: the fp32 residual stream crosses the stage
    boundary, the (math) softmax runs in bf16; the count is the analytic table's and the TP=1 PP=1
    model's numel (the variants add no parameter); a run without --squared-relu refuses the
    checkpoint before building a model, naming the activation."""
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from tests.support.launcher import TINY, launch, losses
    flags = TINY + ["--bf16", "--zero-stage", "1", "--pipeline-model-parallel-size", "2", "--global-batch-size", "4",
                    "--train-iters", "4", "--save", str(tmp_path / "ckpt"), "--save-interval", "4"] + VARIANT_FLAGS
    proc, ranks = launch(2, flags, str(tmp_path / "run"))
    import dataclasses
    shape = dataclasses.replace(validate_args(parse_args(args_list=flags), world_size=2, cuda_available=False)
                                .model_shape, vocab_size=600)
    expected = analytic_parameter_counts(shape)
    plain = dataclasses.replace(shape, apply_residual_connection_post_layernorm=False, apply_layernorm_1p=False,
                                activation="gelu")
    assert expected == analytic_parameter_counts(plain)
    assert [ranks[r]["parameters"] for r in (0, 1)] == [expected.total] * 2
    assert "architecture: learned positions, squared_relu ffn 256, layernorm 1p, post-norm residuals, 4 heads, " \
           "tied\n" in proc.stdout
    curve = losses(proc.stdout)
    assert sorted(curve) == [1, 2, 3, 4] and all(math.isfinite(v) for v in curve.values())
    again = [f for f in flags if f != "--squared-relu"] + ["--load", str(tmp_path / "ckpt")]
    proc, _ = launch(2, again, str(tmp_path / "other"), check=False)
    assert proc.returncode == 2
    assert "activation: saved squared_relu vs now gelu" in proc.stdout
    assert "model parameters (exact)" not in proc.stdout


def test_memory_estimate_follows_the_residual_and_softmax_dtypes():
    """bf16, ZeRO 1, 1 rank, micro-batch 2 (s 32, h 64, 4 heads, 2 layers): the estimate is within 5%
    of the bytes autograd saved for backward (without the two terms: 9% and 14% off), and moves by
    hand: the fp32 residual stream adds 2 bytes per element of the 5 norms' inputs (2 per layer,
    the final one), 5 x 2 x s b h; a bf16 softmax in the math path keeps its bf16 output instead of
    the fp32 probabilities and their bf16 copy, 4 bytes less per element of b a s^2 per layer."""
    from tests.support.memory_runs import first_iteration
    base = ["--global-batch-size", "2", "--bf16", "--zero-stage", "1"]
    runs = {}
    for name, extra in (("plain", []), ("fp32_residual", ["--fp32-residual-connection"]),
                        ("math", ["--attention-impl", "math"]),
                        ("math_bf16_softmax", ["--attention-impl", "math", "--no-query-key-layer-scaling"])):
        [(_, _, _, _, predicted, measured)] = run_distributed(1, first_iteration, base + extra)[0]
        runs[name] = predicted["activations"]
        assert 0.95 <= measured["activations"] / predicted["activations"] <= 1.05, (name, predicted, measured)
    b, s, h, a, layers = 2, 32, 64, 4, 2
    assert runs["fp32_residual"] - runs["plain"] == 2 * (2 * layers + 1) * s * b * h
    assert runs["math"] - runs["math_bf16_softmax"] == 4 * b * a * s * s * layers
