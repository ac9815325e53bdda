"""Mixture of experts, in-process on real gloo ranks: the measured count equals the analytic one
equals the sum of numel of the TP=1 EP=1 model, every expert counted once across EP ranks, at
TP in {1, 2} x EP in {1, 2}; the FLOPs formula equals FlopCounterMode on a forward + backward."""
import pytest

from megatron.model.analytic import (
    EXPERT_PREFIX,
    analytic_parameter_counts,
    expert_index,
    flops_per_sample,
    parameter_table,
)
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config

SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32)
BATCH = 2


def _build(**overrides):
    from megatron.model.gpt_model import GPTModel
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    config = tiny_config(**dict(SHAPE, **overrides))
    create_expert_groups(config.shape)
    model = GPTModel(config, seed=SEED)
    attach_expert_groups(model)
    return config, model


def _reference_and_flops():
    """TP=1 EP=1: numel of every parameter by name; FLOPs of a forward + backward."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.moe import MoEOptions
    out = {}
    _, model = _build(num_experts=(4,), mlp_type="residual")
    out["numel"] = sum(p.numel() for p in model.parameters())
    out["names"] = {name: tuple(p.shape) for name, p in model.named_parameters()}
    # top-2 of 2 experts without token dropping: every token reaches both experts and each
    # expert's capacity buffer is exactly the tokens (no padding rows), so the matmuls the
    # experts run are the model FLOPs of top-k routing
    for mlp_type in ("standard", "residual"):
        config, model = _build(num_experts=(2,), topk=2, mlp_type=mlp_type, attention_impl="math",
                               moe=MoEOptions(token_dropping=False))
        tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=SHAPE["seq_length"])
        with FlopCounterMode(display=False) as counter:
            model(tokens, labels, loss_mask).backward()
        # the top-2 gate normalises its two gate values with an einsum (a bmm over [tokens, E]):
        # routing bookkeeping, not a layer of the model; every other bmm is attention's
        moe = "GPTModel.language_model.encoder.layers.1.mlp.deepspeed_moe"
        bookkeeping = counter.get_flop_counts()[moe].get(torch.ops.aten.bmm, 0)
        out[mlp_type] = (counter.get_total_flops(), bookkeeping)
    return out


# (activation checkpointing, loss scale, micro-batches): DeepSpeed multiplies the lm loss by the
# loss scale (fp16) and divides it by the gradient-accumulation steps before backward
AUX_LOSS_CASES = [(False, 1.0, 3), (True, 8.0, 4)]
AUX_COEFF = 0.7


def _aux_loss_gradients(cases):
    """Per case: an MoE model's gradient under the engine's aux-loss scale (megatron/training/engine.py sets
    it around a training batch), and the reference, written out here: the same weights with
    --moe-loss-coeff 0 give the lm loss's gradient, and DeepSpeed's own l_aux of each MoE layer
    (MOELayer.l_aux) gives coeff x l_aux's, both scaled as DeepSpeed scales the loss."""
    import torch

    from megatron.model.moe import MoEOptions
    from megatron.model.moe.aux_loss import aux_loss_gradient_scale, take_recorded_moe_losses
    out = []
    for checkpoint, loss_scale, micro_batches in cases:
        def build(coeff, checkpoint=checkpoint):
            return _build(num_experts=(4,), expert_interval=1, topk=2, attention_impl="math",
                          moe=MoEOptions(loss_coeff=coeff, top2_2nd_expert_sampling=False),
                          checkpoint_activations=checkpoint, checkpoint_num_layers=1)
        config, model = build(AUX_COEFF)
        tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=SHAPE["seq_length"])
        take_recorded_moe_losses()
        with aux_loss_gradient_scale(loss_scale, micro_batches):
            loss = model(tokens, labels, loss_mask)
            (loss * loss_scale / micro_batches).backward()
        recorded = take_recorded_moe_losses()
        got = {name: p.grad for name, p in model.named_parameters()}

        _, reference = build(0.0)  # the same seed: the same weights, routing and l_aux
        reference.language_model.encoder.checkpoint_activations = False
        ref_loss = reference(tokens, labels, loss_mask)
        l_aux = [layer.mlp.deepspeed_moe.l_aux for layer in reference.language_model.encoder.layers]
        params = [p for _, p in reference.named_parameters()]
        lm_grads = torch.autograd.grad(ref_loss * loss_scale / micro_batches, params, retain_graph=True,
                                       allow_unused=True)
        aux_grads = torch.autograd.grad(AUX_COEFF * sum(l_aux) * loss_scale / micro_batches, params,
                                        allow_unused=True)
        names = [name for name, _ in reference.named_parameters()]
        want = {n: sum(g for g in (lm, aux) if g is not None)
                for n, lm, aux in zip(names, lm_grads, aux_grads, strict=True)}
        aux_part = {n: g for n, g in zip(names, aux_grads, strict=True) if g is not None}
        out.append(dict(loss=(loss.item(), ref_loss.item()), got=got, want=want, aux_part=aux_part,
                        recorded=[r.item() for r in recorded], l_aux=[t.item() for t in l_aux]))
    return out


def _tp1_ep1_checks():
    return dict(flops=_reference_and_flops(), aux=_aux_loss_gradients(AUX_LOSS_CASES))


@pytest.fixture(scope="module")
def tp1_ep1():
    """One worker process for the TP=1 EP=1 checks."""
    [out] = run_distributed(1, _tp1_ep1_checks)
    return out


def test_aux_loss_reaches_the_gradient_once_scaled_like_the_lm_loss(tp1_ep1):
    """The aux loss rides on the layer output's gradient (megatron/model/moe/aux_loss.py): the
    gradient is that of (lm loss + coeff x sum of l_aux) x loss scale / micro-batches, with and
    without recomputation; the value stays the lm loss; a training forward records the moe loss
    once (a recomputation records nothing)."""
    import torch
    for (checkpoint, _loss_scale, _micro_batches), case in zip(AUX_LOSS_CASES, tp1_ep1["aux"], strict=True):
        assert case["loss"][0] == case["loss"][1], checkpoint  # the lm loss alone, bit for bit
        assert case["recorded"] == [pytest.approx(AUX_COEFF * sum(case["l_aux"]), rel=1e-6)], checkpoint
        assert set(case["got"]) == set(case["want"])
        for name, grad in case["got"].items():
            torch.testing.assert_close(grad, case["want"][name], rtol=1e-5, atol=1e-6, msg=f"{checkpoint} {name}")
        # the aux part is far above the tolerance (in the routers, and through the hidden states
        # everything below them): a gradient without it would fail the comparison above
        gates = [n for n in case["aux_part"] if "gate" in n]
        assert len(gates) == 2
        for name in gates:
            assert case["aux_part"][name].norm() > 0.01 * case["want"][name].norm(), name


def test_flops_formula_and_numel_at_tp1_ep1(tp1_ep1):
    out = tp1_ep1["flops"]
    shape = ModelShape(**SHAPE, num_experts=(4,), mlp_type="residual")
    assert out["numel"] == analytic_parameter_counts(shape).total
    table = {spec.key if spec.layer == 2 else None: spec.shape for spec in parameter_table(shape)}
    for name, size in out["names"].items():  # the table's names are DeepSpeed's module names
        if ".layers.1." in name:
            assert table[name.split(".layers.1.")[1]] == size, name
    for mlp_type in ("standard", "residual"):
        measured, bookkeeping = out[mlp_type]
        shape = ModelShape(**SHAPE, num_experts=(2,), topk=2, mlp_type=mlp_type)
        s, h, f = SHAPE["seq_length"], SHAPE["hidden_size"], 4 * SHAPE["hidden_size"]
        dense = ModelShape(**SHAPE)
        # by hand: the dense model, plus in layer 2 one more expert MLP (top-2), the router 2shE
        # and, for PR-MoE, the dense MLP again plus its coefficient (h -> 2)
        extra = 4 * s * h * f + 2 * s * h * 2 + (4 * s * h * f + 2 * s * h * 2 if mlp_type == "residual" else 0)
        assert flops_per_sample(shape, False) == flops_per_sample(dense, False) + 3 * extra
        assert 0 < bookkeeping <= 8 * BATCH * s * 2  # a few (tokens x E) products, nothing like a layer
        assert measured - bookkeeping == BATCH * flops_per_sample(shape, False)


def _counts_at_tp2(layouts):
    """Several MoE models on this TP=2 x DP=2 world: (counts, owned global expert indices)."""
    from megatron import mpu
    from megatron.utils import compute_parameter_counts, moe_parameter_owner
    results = []
    for overrides in layouts:
        config, model = _build(**overrides)
        owned = moe_parameter_owner(model, mpu)
        experts = set()
        for layer in model.language_model.encoder.layers:
            moe = layer.mlp
            if not hasattr(moe, "deepspeed_moe"):
                continue
            from megatron.model.moe import mpu_ep_rank_first_expert
            first = mpu_ep_rank_first_expert(moe)
            for local, expert in enumerate(moe.deepspeed_moe.experts.deepspeed_experts):
                for name, p in expert.named_parameters():
                    if owned(p):
                        experts.add((layer.layer_number, first + local, name, mpu.get_tensor_model_parallel_rank()))
        results.append((compute_parameter_counts(model, mpu, config.shape), experts))
    return results


def test_count_at_tp2_ep1_and_ep2_every_expert_once():
    layouts = [dict(num_experts=(4,), moe_expert_parallel_size=2, mlp_type="residual", topk=2,
                    tensor_model_parallel_size=2),
               dict(num_experts=(4,), moe_expert_parallel_size=1, enable_expert_tensor_parallelism=True,
                    mlp_type="residual", tensor_model_parallel_size=2)]
    per_rank = run_distributed(4, _counts_at_tp2, layouts, tp=2)
    for i, overrides in enumerate(layouts):
        shape = ModelShape(**dict(SHAPE, **overrides))
        expected = analytic_parameter_counts(shape)
        for rank, results in enumerate(per_rank):
            assert results[i][0] == expected, (overrides, rank)
        # each (layer, expert, tensor) owned by exactly one rank (by each TP rank when TP-split)
        owned = [key for results in per_rank for key in results[i][1]]
        assert len(owned) == len(set(owned))
        experts = {spec for spec in parameter_table(shape) if spec.component == "experts"}
        split = shape.enable_expert_tensor_parallelism
        want = {(spec.layer, expert_index(spec), spec.key[len(EXPERT_PREFIX):].split(".", 1)[1], tp)
                for spec in experts for tp in (range(2) if split and spec.partition_dim is not None else [0])}
        got = {(layer, e, name, tp if split else 0) for layer, e, name, tp in owned}
        assert got == want and len(owned) == len(want)
    # the active count: everything but the experts, plus top-k experts per MoE layer
    shape = ModelShape(**dict(SHAPE, **layouts[0]))
    counts = analytic_parameter_counts(shape)
    expert = 8 * 64 * 64 + 5 * 64
    assert counts.components["experts"] == 4 * expert and counts.experts_active == 2 * expert
    assert counts.active == counts.total - 2 * expert
    assert counts.active_no_embedding == counts.no_embedding - 2 * expert


def test_table_names_the_experts_by_global_index():
    shape = ModelShape(**dict(SHAPE, num_layers=4, num_experts=(2, 8), expert_interval=2))
    assert shape.experts_per_layer() == [1, 2, 1, 8]
    keys = [spec.key for spec in parameter_table(shape) if spec.layer == 4 and spec.component == "experts"]
    assert keys[0] == EXPERT_PREFIX + "0.dense_h_to_4h.weight" and keys[-1] == EXPERT_PREFIX + "7.dense_4h_to_h.bias"


@pytest.mark.parametrize("overrides, flag", [
    (dict(num_experts=(3,), moe_expert_parallel_size=2), "--num-experts 3 is not divisible"),
    (dict(num_experts=(2, 2, 2)), "--num-experts takes one value or one per MoE layer"),
    (dict(num_experts=(2,), topk=3), "--topk 3 exceeds --num-experts 2"),
    (dict(moe_expert_parallel_size=2), "--moe-expert-parallel-size 2 needs MoE layers"),
])
def test_bad_moe_shapes(overrides, flag):
    with pytest.raises(ConfigError, match=flag):
        ModelShape(**SHAPE, **overrides)


def _validated(extra, world_size):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    base = ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
            "--micro-batch-size", 2, "--train-iters", 10, "--lr", "1e-3", "--mock-data", "--vocab-size", 600,
            "--num-experts", 4]
    return validate_args(parse_args(args_list=[str(x) for x in base + extra]), world_size=world_size,
                         cuda_available=False)


@pytest.mark.parametrize("extra, world_size, message", [
    (["--moe-expert-parallel-size", 4], 2, "--moe-expert-parallel-size 4 does not divide the data-parallel size 2"),
    (["--pipeline-model-parallel-size", 2, "--moe-expert-parallel-size", 2], 2,
     "--moe-expert-parallel-size 2 does not divide the data-parallel size 1"),
    # 64 tokens over 4 experts x 1.03 -> capacity 17 slots, which DeepSpeed cannot split over 2 TP ranks
    (["--tensor-model-parallel-size", 2, "--moe-train-capacity-factor", 1.03], 2,
     "--moe-train-capacity-factor 1.03: expert capacity 17 .* not divisible by --tensor-model-parallel-size 2"),
    (["--no-pipeline-parallel", "--zero-stage", 1], 1, "ZeRO stage 1 with MoE needs --create-moe-param-group"),
    # DeepSpeed's BF16_Optimizer (pipeline engine, ZeRO 0) asserts on a model without MoE groups
    (["--bf16"], 1, "--bf16 with MoE on the pipeline engine needs --create-moe-param-group"),
])
def test_bad_moe_flags_fail_early(extra, world_size, message):
    with pytest.raises(ConfigError, match=message):
        _validated(extra, world_size)


def test_fork_flag_spellings_and_defaults():
    args = _validated(["--no-pipeline-parallel", "--moe-expert-parallel-size", 2, "--disable-moe-token-dropping",
                       "--create-moe-param-group", "--mlp-type", "residual"], 2)
    assert (args.expert_interval, args.topk, args.moe_loss_coeff, args.moe_min_capacity) == (2, 1, 0.1, 4)
    assert (args.moe_train_capacity_factor, args.moe_eval_capacity_factor) == (1.0, 1.0)
    assert args.moe_token_dropping is False and args.moe_top2_2nd_expert_sampling is True
    assert args.model_shape.experts_per_layer() == [1, 4] and args.model_shape.mlp_type == "residual"


def test_param_count_tool_prints_total_active_and_per_ep_rank():
    import subprocess
    import sys
    # DeepSpeed-MoE's 350M+MoE-128: 24 layers, hidden 1024, an MoE layer every other layer
    flags = ["--num-layers", 24, "--hidden-size", 1024, "--num-attention-heads", 16, "--seq-length", 2048,
             "--vocab-size", 50257, "--num-experts", 128, "--moe-expert-parallel-size", 8]
    out = subprocess.run([sys.executable, "tools/param_count.py", *map(str, flags)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    h, expert = 1024, 8 * 1024 * 1024 + 5 * 1024
    dense_no_embedding = 24 * (12 * h * h + 13 * h) + 2 * h
    embeddings = 50304 * h + 2048 * h
    total = dense_no_embedding - 12 * expert + 12 * (128 * expert + 128 * h) + embeddings
    active = dense_no_embedding + 12 * 128 * h + embeddings  # one expert per token replaces the MLP
    assert f"parameters: {total:,}\n" in out and total == 13_149_534_208
    assert f"active parameters: {active:,}\n" in out
    assert f"active parameters without embeddings: {active - embeddings:,}\n" in out
    assert f"experts per EP rank (EP=8): {12 * 16} experts, {12 * 16 * expert:,} expert parameters" in out


def _untied_output_weights():
    """The untied output layer of an MoE model as GPTModel and as GPTModelPipe (PP=1) build it."""
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel, GPTModelPipe
    from megatron.model.language_model import OutputLayer
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    config = tiny_config(**dict(SHAPE, num_experts=(2,), untie_embeddings_and_output_weights=True))
    create_expert_groups(config.shape)
    plain = GPTModel(config, seed=SEED)
    attach_expert_groups(plain)
    pipe = GPTModelPipe(config, topology=mpu.get_topology(), seed=SEED)
    [output] = [f for f in pipe.forward_funcs if isinstance(f, OutputLayer)]
    return plain.language_model.output_layer.weight.detach().clone(), output.weight.detach().clone()


def test_moe_untied_output_layer_starts_the_same_on_both_engines():
    """--no-pipeline-parallel and the pipeline engine start from the same output weights: an MoE
    pipe builds the output layer one index later (after `take`), and GPTModel seeds it there too."""
    import torch
    [(plain, pipe)] = run_distributed(1, _untied_output_weights)
    assert torch.equal(plain, pipe)

