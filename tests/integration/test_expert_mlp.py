"""An expert is the dense MLP: every MLP variant the flags ask for (GLU kind, ffn size, no biases)
is what the experts compute, checked against a plain-PyTorch MLP written here, with the exact
count by hand; and the MoE FLOPs formula counts the experts a token actually passes through
(top-k of E, measured on the tokens each expert received), not all E."""
import torch
import torch.nn.functional as F

from tests.support.distributed import run_distributed

H = 64
# the activation each GLU kind applies to its gate (Shazeer 2020, "GLU Variants Improve Transformer")
GATE_ACTIVATION = {"swiglu": F.silu, "geglu": F.gelu, "reglu": F.relu, "liglu": lambda t: t}


def plain_mlp(x, kind, w_in, b_in, w_out, b_out):
    """h -> f -> h in plain PyTorch. A GLU's first projection yields 2f units; in this code base's
    weight layout unit 2j is gate j and unit 2j + 1 its value (tools/convert_checkpoint_to_hf.py
    relies on the same layout for LLaMA's gate_proj / up_proj)."""
    hidden = x @ w_in.t() + (0 if b_in is None else b_in)
    if kind is None:
        hidden = F.gelu(hidden)
    else:
        hidden = GATE_ACTIVATION[kind](hidden[..., 0::2]) * hidden[..., 1::2]
    return hidden @ w_out.t() + (0 if b_out is None else b_out)


def _flags(extra):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    base = ["--num-layers", 2, "--hidden-size", H, "--num-attention-heads", 4, "--seq-length", 16,
            "--micro-batch-size", 2, "--train-iters", 1, "--lr", "1e-3", "--mock-data", "--vocab-size", 128,
            "--hidden-dropout", 0, "--attention-dropout", 0, "--no-pipeline-parallel"]
    return validate_args(parse_args(args_list=[str(x) for x in base + extra]), world_size=1, cuda_available=False)


def _mlps(model):
    """[(where, module)]: the dense layer's MLP and every expert of the MoE layer."""
    dense, moe = (layer.mlp for layer in model.language_model.encoder.layers)
    experts = moe.deepspeed_moe.experts.deepspeed_experts
    return [("dense", dense)] + [(f"expert {e}", expert) for e, expert in enumerate(experts)]


def _built(flag_sets):
    """Per flag set: each MLP's parameter shapes, its output and the plain MLP's on the same input,
    and the measured total count."""
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    from megatron.utils import compute_parameter_counts
    out = []
    for flags in flag_sets:
        args = _flags(flags)
        create_expert_groups(args.model_shape)
        model = GPTModel(GPTConfig.from_args(args), seed=1234)
        attach_expert_groups(model)
        x = torch.randn(5, 3, H, generator=torch.Generator().manual_seed(0))
        mlps = []
        for where, mlp in _mlps(model):
            p = mlp.dense_h_to_4h, mlp.dense_4h_to_h
            with torch.no_grad():
                ours = mlp(x)
                theirs = plain_mlp(x, args.model_shape.glu_activation, p[0].weight, p[0].bias, p[1].weight, p[1].bias)
            mlps.append((where, {n: tuple(t.shape) for n, t in mlp.named_parameters()}, ours, theirs))
        out.append((mlps, compute_parameter_counts(model, mpu, args.model_shape).total))
    return out


CASES = [
    # --swiglu: ffn int(8 x 64 / 3 / 64) x 64 = 128, no biases
    (["--swiglu", "--disable-bias-linear"], "swiglu", 128, False),
    (["--glu-activation", "geglu", "--ffn-hidden-size", 96], "geglu", 96, True),
    (["--glu-activation", "reglu", "--ffn-hidden-size", 32, "--disable-bias-linear"], "reglu", 32, False),
    (["--glu-activation", "liglu"], "liglu", 4 * H, True),
    ([], None, 4 * H, True),  # the GeLU MLP
]


def test_experts_are_built_like_the_dense_mlp():
    flag_sets = [flags + ["--num-experts", 4] for flags, *_ in CASES]
    [results] = run_distributed(1, _built, flag_sets)
    for (flags, kind, f, bias), (mlps, total) in zip(CASES, results, strict=True):
        width = 2 * f if kind else f  # a GLU's first projection: gate and value
        want = {"dense_h_to_4h.weight": (width, H), "dense_4h_to_h.weight": (H, f)}
        if bias:
            want.update({"dense_h_to_4h.bias": (width,), "dense_4h_to_h.bias": (H,)})
        assert [where for where, *_ in mlps] == ["dense"] + [f"expert {e}" for e in range(4)]
        for where, shapes, ours, theirs in mlps:
            assert shapes == want, (flags, where)
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=f"{flags} {where}")
        # by hand: embeddings (128 + 16) x H; per layer two LayerNorms 4H and attention 4H^2
        # (+ 4H biases); layer 1 one MLP, layer 2 the router 4H and 4 experts; final LayerNorm 2H
        mlp = H * width + f * H + (width + H if bias else 0)
        attention = 4 * H * H + (4 * H if bias else 0)
        assert total == (128 + 16) * H + 2 * (4 * H + attention) + mlp + 4 * H + 4 * mlp + 2 * H, flags


def _executed_moe_flops(cases):
    """Per (E, k): forward FLOPs of the MoE layer's experts on the tokens each one received, its
    router's matmul, and the dense layer's MLP, all on one batch, measured by FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.gpt_model import GPTModel
    from megatron.model.moe import MoEOptions, attach_expert_groups, create_expert_groups
    from tests.support.model_fixtures import tiny_batch, tiny_config
    out = []
    for experts, k in cases:
        config = tiny_config(hidden_size=H, seq_length=32, num_experts=(experts,), topk=k, attention_impl="math",
                             moe=MoEOptions(token_dropping=False))  # every token reaches its k experts
        create_expert_groups(config.shape)
        model = GPTModel(config, seed=1234).eval()
        attach_expert_groups(model)
        dense, moe = (layer.mlp for layer in model.language_model.encoder.layers)
        received = []  # per expert call: the rows it got that hold a token (the rest is capacity padding)
        hooks = [expert.register_forward_pre_hook(
                     lambda m, inp, received=received: received.append(int((inp[0] != 0).any(-1).sum())))
                 for expert in moe.deepspeed_moe.experts.deepspeed_experts]
        seen = {}
        hooks += [m.register_forward_pre_hook(lambda m, inp, name=name, seen=seen: seen.update({name: inp[0].detach()}))
                  for name, m in (("dense", dense), ("router", moe.deepspeed_moe.gate))]
        tokens, labels, loss_mask = tiny_batch(config, batch_size=2, seq_length=32)
        with torch.no_grad():
            model(tokens, labels, loss_mask)
        for hook in hooks:
            hook.remove()

        def flops(fn):
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                fn()
            return counter.get_total_flops()
        one_token = torch.randn(1, 1, H)
        expert = moe.deepspeed_moe.experts.deepspeed_experts[0]
        per_token = flops(lambda expert=expert, one_token=one_token: expert(one_token))
        out.append(dict(received=received, expert_flops=sum(received) * per_token,
                        # the router's matmul: the gate's own input times its h -> E weight
                        router=flops(lambda seen=seen, moe=moe:
                                     F.linear(seen["router"].float(), moe.deepspeed_moe.gate.wg.weight)),
                        dense=flops(lambda dense=dense, seen=seen: dense(seen["dense"]))))
    return out


def test_moe_flops_count_the_top_k_experts_actually_executed():
    from megatron.model.analytic import flops_per_sample
    from megatron.model.shape import ModelShape
    cases = [(4, 1), (4, 2), (8, 1), (8, 2)]
    [measured] = run_distributed(1, _executed_moe_flops, cases)
    batch, s = 2, 32
    dense = ModelShape(num_layers=2, hidden_size=H, num_attention_heads=4, vocab_size=128, seq_length=s)
    for (experts, k), m in zip(cases, measured, strict=True):
        assert sum(m["received"]) == k * batch * s, (experts, k)  # each token went to k experts, not E
        assert len(m["received"]) == experts
        # by hand: an expert is a GeLU MLP 2 x (h x 4h + 4h x h) per token; the router 2hE per token
        assert m["expert_flops"] == k * batch * s * 2 * 8 * H * H
        assert m["router"] == batch * s * 2 * H * experts
        shape = ModelShape(num_layers=2, hidden_size=H, num_attention_heads=4, vocab_size=128, seq_length=s,
                           num_experts=(experts,), topk=k)
        # the formula's model FLOPs per sample (forward + backward = 3 x forward): the dense model
        # with layer 2's MLP replaced by the experts executed and the router, per sample
        moe_minus_dense = (m["expert_flops"] + m["router"] - m["dense"]) // batch
        assert flops_per_sample(shape, False) == flops_per_sample(dense, False) + 3 * moe_minus_dense, (experts, k)
