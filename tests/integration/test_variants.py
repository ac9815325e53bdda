"""Architecture variants (tests/support/variants.py), in real multi-process gloo runs: the built model's
count equals the analytic table and the TP=1 PP=1 model's numel at TP x PP in {1,2}^2; the FLOPs
formula equals FlopCounterMode; TP=2 reproduces TP=1's logits and gradients, sdpa agrees with
math attention, PP=2 reproduces PP=1's loss and updates (untied included)."""
import pytest
import torch

from megatron.model.analytic import analytic_parameter_counts, flops_per_sample, stage_parameters
from megatron.model.positional_embeddings import alibi_slopes
from megatron.model.shape import ModelShape
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config
from tests.support.variants import TP2_VARIANTS, VARIANTS, shape_kwargs

BATCH = 2


def _layout_shape(name):
    from megatron import mpu
    return ModelShape(**shape_kwargs(name, tensor_model_parallel_size=mpu.get_tensor_model_parallel_world_size(),
                                     pipeline_model_parallel_size=mpu.get_pipeline_model_parallel_world_size()))


def _built_counts(names):
    """{variant: (measured ParameterCounts, numel of the plain GPTModel at this TP x PP or None)}."""
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel, GPTModelPipe
    from megatron.utils import compute_parameter_counts
    out = {}
    for name in names:
        shape = _layout_shape(name)
        pipe = GPTModelPipe(GPTConfig(shape), mpu.get_topology())
        counts = compute_parameter_counts(pipe, mpu, shape)
        numel = None
        if mpu.get_model_parallel_world_size() == 1:  # the whole model in one module
            plain = list(GPTModel(GPTConfig(shape)).parameters())
            numel = sum(p.numel() for p in plain)
            # both wrappers build the same weights, layer by layer (untied output layer included)
            pipe_params = list(pipe.parameters())
            assert len(pipe_params) == len(plain) and all(map(torch.equal, pipe_params, plain)), name
        out[name] = (counts, numel)
    return out


def test_count_equals_analytic_and_tp1_pp1_numel_at_every_layout():
    [single] = run_distributed(1, _built_counts, list(VARIANTS))
    tp2_pp2 = run_distributed(4, _built_counts, TP2_VARIANTS, tp=2, pp=2)
    pp2 = run_distributed(2, _built_counts, ["mqa", "llama", "bloom"], pp=2)  # MQA runs at TP=1 only
    for name in VARIANTS:
        counts, numel = single[name]
        assert counts == analytic_parameter_counts(ModelShape(**shape_kwargs(name))), name
        assert counts.total == numel, name
        layouts = [(pp2, 1, 2)] if name in ("mqa", "llama", "bloom") else []
        layouts += [(tp2_pp2, 2, 2)] if name in TP2_VARIANTS else []
        for ranks, tp, pp in layouts:
            shape = ModelShape(**shape_kwargs(name, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp))
            for rank in ranks:
                # components and per-stage held / owned elements; the vocab pads alike at TP 1 and 2
                assert rank[name][0] == analytic_parameter_counts(shape), (name, tp, pp)
                assert rank[name][0].total == numel and rank[name][0].no_embedding == counts.no_embedding


def test_untied_last_stage_holds_no_embedding_copy():
    tied, untied = (ModelShape(**shape_kwargs(n, pipeline_model_parallel_size=2)) for n in ("gpt2", "llama"))
    assert {spec.component for spec, owned in stage_parameters(tied, 1) if not owned} == {
        "word_embeddings", "position_embeddings"}
    last = stage_parameters(untied, 1)
    assert all(owned for _, owned in last)
    assert "word_embeddings" not in {spec.component for spec, _ in last}
    assert {spec.component for spec, _ in last} >= {"output_layer"}


def _measure_flops(names):
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.gpt_model import GPTModel
    out = {}
    for name in names:
        for recompute in (False, True):
            # "math" attention spells out QK^T and PV as matmuls, which FlopCounterMode sees on CPU
            config = tiny_config(**shape_kwargs(name), checkpoint_activations=recompute, attention_impl="math")
            model = GPTModel(config, seed=SEED).train()
            tokens, labels, loss_mask = tiny_batch(config, batch_size=BATCH, seq_length=config.shape.seq_length)
            with FlopCounterMode(display=False) as counter:
                model(tokens, labels, loss_mask).backward()
            out[name, recompute] = counter.get_total_flops()
    return out


def test_flops_formula_equals_flop_counter_for_every_variant():
    [measured] = run_distributed(1, _measure_flops, list(VARIANTS))
    for (name, recompute), flops in measured.items():
        assert flops == BATCH * flops_per_sample(ModelShape(**shape_kwargs(name)), recompute), (name, recompute)


def _forward_backward(names, impls):
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    from megatron.model.transformer import ParallelAttention
    out = {}
    for name in names:
        for impl in impls:
            config = tiny_config(**shape_kwargs(name), attention_impl=impl)
            model = GPTModel(config, seed=SEED)
            tokens, labels, loss_mask = tiny_batch(config, seq_length=config.shape.seq_length)
            logits = mpu.gather_from_tensor_model_parallel_region(model(tokens))  # [s, b, V]
            loss = model(tokens, labels, loss_mask)
            loss.backward()
            slopes = [m.alibi_slopes.tolist() for m in model.modules()
                      if isinstance(m, ParallelAttention) and hasattr(m, "alibi_slopes")]
            out[name, impl] = {"logits": logits.detach(), "loss": loss.item(), "slopes": slopes,
                               "params": {n: (p.detach().clone(), p.grad.clone(), getattr(p, "partition_dim", None))
                                          for n, p in model.named_parameters()}}
    return out


def test_tp2_reproduces_tp1_and_sdpa_agrees_with_math():
    [ref] = run_distributed(1, _forward_backward, list(VARIANTS), ["sdpa", "math"])
    for name in VARIANTS:  # both attention implementations compute the same function
        a, b = ref[name, "sdpa"], ref[name, "math"]
        torch.testing.assert_close(a["logits"], b["logits"], rtol=1e-5, atol=1e-6, msg=name)
        for key in a["params"]:
            torch.testing.assert_close(a["params"][key][1], b["params"][key][1], rtol=1e-4, atol=1e-6, msg=key)
    tp = run_distributed(2, _forward_backward, TP2_VARIANTS, ["sdpa", "math"], tp=2)
    for rank, out in enumerate(tp):
        for (name, impl), got in out.items():
            want = ref[name, "sdpa"]
            assert got["params"].keys() == want["params"].keys()
            for key, (weight, grad, dim) in got["params"].items():
                full_weight, full_grad, _ = want["params"][key]
                # initial weights are exactly the TP=1 slices; gradients are the TP=1 gradients' slices
                # (GLU gate/value pairs and whole kv groups per rank make the slices mean the same)
                assert torch.equal(weight, full_weight if dim is None else full_weight.chunk(2, dim)[rank]), key
                torch.testing.assert_close(grad, full_grad if dim is None else full_grad.chunk(2, dim)[rank],
                                           rtol=1e-5, atol=1e-6, msg=f"{name} {impl} {key}")
            torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-6, msg=name)
            assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
            # ALiBi: each rank uses the slopes of its own heads
            heads = VARIANTS[name].get("num_attention_heads", 8) // 2
            if VARIANTS[name].get("position_embedding_type") == "alibi":
                assert got["slopes"] == [alibi_slopes(heads * 2)[rank * heads:(rank + 1) * heads]] * 2


def test_alibi_slopes_by_hand():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]  # start 2^(-8/8), ratio the same
    # 6 heads: the 4-head sequence 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


def _pipeline_step(names):
    import deepspeed

    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModelPipe
    out = {}
    for name in names:
        config = GPTConfig(_layout_shape(name), hidden_dropout=0.0, attention_dropout=0.0)
        model = GPTModelPipe(config, topology=mpu.get_topology(), seed=SEED)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                    "gradient_clipping": 0.0, "steps_per_print": 10 ** 9})
        batches = []
        for i in range(2):
            tokens, labels, loss_mask = tiny_batch(config, seq_length=config.shape.seq_length, seed=i)
            batches.append((tokens, (labels, loss_mask)))
        eval_loss = engine.eval_batch(iter(batches)).item()
        train_loss = engine.train_batch(iter(batches)).item()
        out[name] = {"initial": initial, "updated": {k: v.clone() for k, v in model.state_dict().items()},
                     "eval_loss": eval_loss, "train_loss": train_loss, "tied": list(model.tied_modules)}
    return out


def test_pp2_reproduces_pp1_untied_included():
    names = ["llama", "bloom", "liglu_untied", "reglu_embed_ln"]
    [ref] = run_distributed(1, _pipeline_step, names)
    stages = run_distributed(2, _pipeline_step, names, pp=2)
    for name in names:
        untied = VARIANTS[name].get("untie_embeddings_and_output_weights", False)
        keys = set()
        for stage, out in enumerate(stages):
            got, want = out[name], ref[name]
            assert got["tied"] == ([] if untied else ["embed"]), name  # no TiedLayerSpec when untied
            assert got["eval_loss"] == pytest.approx(want["eval_loss"], abs=1e-6), name
            assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-6), name
            for key, value in got["initial"].items():
                if stage == 1 and key.startswith("tied_modules") and "word_embeddings" not in key:
                    continue  # the last stage's unused copy of the position table
                assert torch.equal(value, want["initial"][key]), (name, key)
                torch.testing.assert_close(got["updated"][key], want["updated"][key], rtol=1e-5, atol=1e-6,
                                           msg=f"{name} {key}")
                keys.add(key)
        assert keys == set(ref[name]["initial"]), name
        if untied:  # the output layer is the last layer's own weight, and it trained
            out_key = f"{2 + 2}.weight"
            assert out_key in stages[1][name]["updated"] and out_key not in stages[0][name]["updated"]
            assert not torch.equal(stages[1][name]["updated"][out_key], stages[1][name]["initial"][out_key])
