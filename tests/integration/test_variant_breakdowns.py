"""Per-component and per-stage parameter counts of every architecture variant (tests/support/variants.py)
derived without the code's parameter table (issue 30 item 2): by hand from the variant's fields,
and from what DeepSpeed itself built on real PP=2 ranks (each stage's named parameters and their
numel, the tied embedding copy by DeepSpeed's `tied_modules.` name). The code's ParameterCounts
(the analytic table and the count measured at build) must equal both. One launch per layout."""
from megatron.model.analytic import analytic_parameter_counts
from megatron.model.shape import ModelShape
from tests.support.distributed import run_distributed
from tests.support.variants import TP2_VARIANTS, VARIANTS, shape_kwargs


def _stage_parameters(names, tp=1):
    """{variant: (stage, [(name, numel)] as DeepSpeed's PipelineModule holds them, measured counts)}."""
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.utils import compute_parameter_counts
    out = {}
    for name in names:
        shape = ModelShape(**shape_kwargs(name, tensor_model_parallel_size=tp, pipeline_model_parallel_size=2))
        pipe = GPTModelPipe(GPTConfig(shape), mpu.get_topology())
        out[name] = (pipe.stage_id, [(n, p.numel()) for n, p in pipe.named_parameters()],
                     compute_parameter_counts(pipe, mpu, shape), list(pipe.parts))
    return out


def by_hand(name):
    """{component: elements} from the variant's fields (Megatron-DeepSpeed's modules)."""
    v = shape_kwargs(name)
    h, layers, a, s, vocab = v["hidden_size"], v["num_layers"], v["num_attention_heads"], v["seq_length"], 256
    g = v.get("num_key_value_heads", a)
    d = v.get("kv_channels", h // a)
    glu = v.get("swiglu", False) or v.get("glu_activation") is not None
    f = v.get("ffn_hidden_size", (int(8 * h / 3 / 64) * 64) if v.get("swiglu") else 4 * h)
    bias = v.get("add_bias_linear", True)
    qkv_bias = bias or v.get("add_qkv_bias", False)  # Megatron-LM's rule for the QKV's bias
    norm = h if v.get("normalization") == "rmsnorm" else 2 * h
    qkv = (a + 2 * g) * d
    m = 2 if glu else 1  # a GLU's dense_h_to_4h yields gate and value
    return {
        "word_embeddings": vocab * h,
        "position_embeddings": s * h if v.get("position_embedding_type", "absolute") == "absolute" else 0,
        # BLOOM's word_embeddings_layernorm: a LayerNorm (weight and bias) whatever --normalization says
        "embedding_layernorm": 2 * h if v.get("embed_layernorm") else 0,
        "attention": layers * (h * qkv + qkv_bias * qkv + a * d * h + bias * h),
        "mlp": layers * (h * m * f + bias * m * f + f * h + bias * h),
        "layernorm": layers * 2 * norm + norm,
        "output_layer": vocab * h if v.get("untie_embeddings_and_output_weights") else 0,
        "experts": 0,
        "router": 0,
    }


def component_of(param_name):
    """A parameter's component from the module name DeepSpeed gave it (not from the table)."""
    for key, component in (("word_embeddings", "word_embeddings"), ("position_embeddings", "position_embeddings"),
                           ("embedding_layernorm", "embedding_layernorm"), ("self_attention.", "attention"),
                           ("mlp.", "mlp"), ("layernorm", "layernorm")):
        if key in param_name:
            return component
    assert param_name.split(".")[-1] in ("weight", "bias"), param_name
    return "output_layer_or_final_norm"


def test_components_and_stages_of_every_variant_at_pp2():
    ranks = run_distributed(2, _stage_parameters, list(VARIANTS), pp=2)
    for name in VARIANTS:
        hand = by_hand(name)
        shape = ModelShape(**shape_kwargs(name, pipeline_model_parallel_size=2))
        analytic = analytic_parameter_counts(shape)
        assert analytic.components == hand, name
        built = {}
        held, owned, layer_of_stage = [], [], []
        for rank in ranks:
            stage, params, measured, parts = rank[name]
            assert measured == analytic, name
            # the embedding and layer 1 on stage 0; layer 2, the final norm and the head on stage 1
            layer_of_stage.append(sorted({p.split(".")[0] for p, _ in params}))
            held.append(sum(n for _, n in params))
            # the last stage's copy of the tied embedding (DeepSpeed's tied_modules) is the first stage's
            mine = [(p, n) for p, n in params if not (stage == 1 and p.startswith("tied_modules."))]
            owned.append(sum(n for _, n in mine))
            for p, n in mine:
                c = component_of(p)
                built[c] = built.get(c, 0) + n
        tied = not VARIANTS[name].get("untie_embeddings_and_output_weights")
        assert layer_of_stage == ([["1", "tied_modules"], ["2", "3", "tied_modules"]] if tied else
                                  [["0", "1"], ["2", "3", "4"]]), (name, layer_of_stage)
        # the head's weight (untied) and the final norm have plain names: split them by size
        h = VARIANTS[name].get("hidden_size", 64)
        final_norm = h if VARIANTS[name].get("normalization") == "rmsnorm" else 2 * h
        built["layernorm"] += final_norm
        assert built.pop("output_layer_or_final_norm") == final_norm + hand["output_layer"], name
        assert built == {c: n for c, n in hand.items() if n and c != "output_layer"}, name
        # per stage: held = what DeepSpeed's stage holds, owned = without the tied copy
        copy = (hand["word_embeddings"] + hand["position_embeddings"]) if tied else 0
        assert [(s.layers, s.held, s.owned) for s in analytic.stages] == [
            (1, held[0], owned[0]), (1, held[1], held[1] - copy)], name
        assert held[1] - copy == owned[1] and sum(owned) == sum(hand.values()), name


def test_stages_at_tp2_pp2_hold_half_the_split_parameters():
    """TP 2 x PP 2: each rank holds its stage's replicated parameters whole and half of every
    TP-split one; the owned elements of a stage are the TP=1 stage's."""
    ranks = run_distributed(4, _stage_parameters, TP2_VARIANTS, 2, tp=2, pp=2)
    for name in TP2_VARIANTS:
        shape = ModelShape(**shape_kwargs(name, tensor_model_parallel_size=2, pipeline_model_parallel_size=2))
        analytic = analytic_parameter_counts(shape)
        single = analytic_parameter_counts(ModelShape(**shape_kwargs(name, pipeline_model_parallel_size=2)))
        for rank in ranks:
            stage, params, measured, _ = rank[name]
            assert measured == analytic, name
            assert analytic.stages[stage].held == sum(n for _, n in params), name
        assert [s.owned for s in analytic.stages] == [s.owned for s in single.stages], name
        hand = by_hand(name)
        v = shape_kwargs(name)
        h, layers, bias = v["hidden_size"], v["num_layers"], v.get("add_bias_linear", True)
        norm = h if v.get("normalization") == "rmsnorm" else 2 * h
        # a TP rank holds half of the vocab rows, of QKV's and h->4h's rows (with their biases) and
        # of dense's and 4h->h's columns; their two biases (h each) and every norm whole
        layer = (hand["attention"] + hand["mlp"]) // layers // 2 + bias * h + 2 * norm
        half_vocab = hand["word_embeddings"] // 2
        expected = [half_vocab + hand["position_embeddings"] + hand["embedding_layernorm"] + layer,
                    layer + norm + half_vocab + (hand["position_embeddings"] if not hand["output_layer"] else 0)]
        for rank in ranks:
            stage, params, _, _ = rank[name]
            assert sum(n for _, n in params) == expected[stage], (name, stage)


# --- mixture of experts: PP 2 x DP 2 with the experts over EP 2 ---------------------------------

MOE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=256,
           num_experts=(4,), moe_expert_parallel_size=2, pipeline_model_parallel_size=2)
MOE_CASES = {"every_layer_top2": dict(expert_interval=1, topk=2),
             "pr_moe_layer_2": dict(expert_interval=2, mlp_type="residual")}


def _moe_stage_parameters(cases):
    """{case: (stage, DP = EP rank, [(name, numel)] DeepSpeed's pipeline module holds, measured counts)}."""
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    from megatron.utils import compute_parameter_counts
    out = {}
    for name, overrides in cases.items():
        shape = ModelShape(**MOE, **overrides)
        create_expert_groups(shape)
        pipe = GPTModelPipe(GPTConfig(shape), mpu.get_topology())
        attach_expert_groups(pipe)
        out[name] = (pipe.stage_id, mpu.get_data_parallel_rank(),
                     [(n, p.numel()) for n, p in pipe.named_parameters()], compute_parameter_counts(pipe, mpu, shape))
    return out


def moe_component_of(param_name):
    if ".deepspeed_experts." in param_name:
        return "experts"
    if ".gate.wg." in param_name or ".coefficient." in param_name:  # the router and PR-MoE's mixing
        return "router"
    return component_of(param_name)


def test_moe_components_and_stages_from_what_deepspeed_built():
    ranks = run_distributed(4, _moe_stage_parameters, MOE_CASES, pp=2)
    h, f, vocab, s = 64, 256, 256, 32
    attention_layer = 3 * h * h + 3 * h + h * h + h
    expert = h * f + f + f * h + h  # each expert is the dense MLP
    hand = {
        "every_layer_top2": dict(word_embeddings=vocab * h, position_embeddings=s * h, embedding_layernorm=0,
                                 attention=2 * attention_layer, mlp=0, layernorm=2 * 2 * 2 * h + 2 * h,
                                 output_layer=0, experts=2 * 4 * expert, router=2 * 4 * h),
        # layer 1 dense; layer 2: 4 experts, the router, PR-MoE's dense MLP and its h -> 2 coefficient
        "pr_moe_layer_2": dict(word_embeddings=vocab * h, position_embeddings=s * h, embedding_layernorm=0,
                               attention=2 * attention_layer, mlp=2 * expert, layernorm=2 * 2 * 2 * h + 2 * h,
                               output_layer=0, experts=4 * expert, router=4 * h + 2 * h + 2),
    }
    active = {"every_layer_top2": 2 * 2 * expert, "pr_moe_layer_2": 1 * expert}
    for name, overrides in MOE_CASES.items():
        counts = analytic_parameter_counts(ModelShape(**MOE, **overrides))
        assert counts.components == hand[name], name
        assert counts.experts_active == active[name], name
        built, held, owned = {}, {}, {0: 0, 1: 0}
        for rank in ranks:
            stage, ep_rank, params, measured = rank[name]
            assert measured == counts, (name, stage, ep_rank)
            if ep_rank == 0:
                held[stage] = sum(n for _, n in params)
            for p, n in params:
                component = moe_component_of(p)
                # experts: each EP rank its own 2 of 4; everything else once (EP rank 0), without
                # the last stage's copy of the tied embedding
                if (component == "experts" or ep_rank == 0) and not (stage == 1 and p.startswith("tied_modules.")):
                    built[component] = built.get(component, 0) + n
                    owned[stage] += n
        built["layernorm"] += built.pop("output_layer_or_final_norm")  # the final norm (tied head)
        assert built == {c: n for c, n in hand[name].items() if n}, name
        copy = vocab * h + s * h
        assert [(c.layers, c.held, c.owned) for c in counts.stages] == [
            (1, held[0], owned[0]), (1, held[1], owned[1])], name
        # EP rank 0 of each stage by hand: its layer (two LayerNorms 4h, attention, the MLP slot with
        # 2 of the 4 experts), the embedding first, the final norm and the embedding's copy last
        embedding = vocab * h + s * h
        moe_slot = 4 * h + 2 * expert                       # router + this EP rank's experts
        pr_slot = 4 * h + 2 * h + 2 + 2 * expert + expert   # + coefficient + PR-MoE's dense MLP
        layer1, layer2 = ((moe_slot, moe_slot) if name == "every_layer_top2" else (expert, pr_slot))
        assert held == {0: embedding + 4 * h + attention_layer + layer1,
                        1: 4 * h + attention_layer + layer2 + 2 * h + copy}, name
        assert owned[0] + owned[1] == sum(hand[name].values()), name
