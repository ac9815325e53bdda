"""megatron/model/analytic.py in-process, against independent references: transformers' own
models built on the meta device (per-component parameter counts), FlopCounterMode on a real
transformers GPT-2 forward + backward (the FLOPs formula, with and without recompute), and hand
derivations (names, fused parts, placement, expert parallelism, recompute sets, C = 6ND)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from megatron.model.analytic import (
    StageCount,
    analytic_parameter_counts,
    entries_by_name,
    experts_per_expert_parallel_rank,
    flops_per_sample,
    fused_parts,
    gigaflos_no_embeds,
    held_by_expert_parallel_rank,
    layers_per_stage,
    mlp_forward_flops,
    parameter_table,
    pipe_items,
    recomputed_layers,
    stage_of_layer,
    table_entry,
)
from megatron.model.shape import ModelShape


def hf_component(name):
    """Our component of a transformers parameter name (GPT-2, Llama, BLOOM, GPTBigCode, Mixtral)."""
    if name.startswith("lm_head"):
        return "output_layer"
    if "word_embeddings_layernorm" in name:
        return "embedding_layernorm"
    if any(k in name for k in ("wte.", "embed_tokens.", "word_embeddings.")):
        return "word_embeddings"
    if "wpe." in name:
        return "position_embeddings"
    if ".mlp.experts." in name:
        return "experts"
    if ".mlp.gate." in name:  # Mixtral's router
        return "router"
    if any(k in name for k in (".attn.", ".self_attn.", ".self_attention.")):
        return "attention"
    if ".mlp." in name:
        return "mlp"
    return "layernorm"  # ln_1, ln_2, ln_f, input_layernorm, post_attention_layernorm, norm


V, L, S = 256, 2, 32
# (transformers model and config, the same model as a ModelShape)
MODELS = {
    "gpt2": ("GPT2LMHeadModel",
             dict(n_layer=L, n_embd=64, n_head=8, n_positions=S, vocab_size=V),
             dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V)),
    "bloom": ("BloomForCausalLM",  # ALiBi, embedding LayerNorm, tied
              dict(n_layer=L, hidden_size=48, n_head=6, vocab_size=V),
              dict(num_layers=L, hidden_size=48, num_attention_heads=6, seq_length=S, vocab_size=V,
                   position_embedding_type="alibi", embed_layernorm=True)),
    "llama": ("LlamaForCausalLM",  # rotary, SwiGLU, RMSNorm, GQA, untied, no bias
              dict(num_hidden_layers=L, hidden_size=64, intermediate_size=160, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=V, tie_word_embeddings=False),
              dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V,
                   position_embedding_type="rotary", swiglu=True, ffn_hidden_size=160, normalization="rmsnorm",
                   num_key_value_heads=2, untie_embeddings_and_output_weights=True, add_bias_linear=False)),
    "llama_head_dim": ("LlamaForCausalLM",  # head dim 24 != h / heads, biased linears
                       dict(num_hidden_layers=L, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=4, head_dim=24, attention_bias=True, mlp_bias=True, vocab_size=V,
                            tie_word_embeddings=False),
                       dict(num_layers=L, hidden_size=64, num_attention_heads=4, seq_length=S, vocab_size=V,
                            position_embedding_type="rotary", swiglu=True, ffn_hidden_size=128,
                            normalization="rmsnorm", kv_channels=24, untie_embeddings_and_output_weights=True)),
    "mqa": ("GPTBigCodeForCausalLM",  # learned positions, one kv head
            dict(n_layer=L, n_embd=64, n_head=8, n_positions=S, vocab_size=V, multi_query=True),
            dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V,
                 num_key_value_heads=1)),
    "mixtral": ("MixtralForCausalLM",  # every layer MoE: 4 SwiGLU experts, top-2, router h -> E
                dict(num_hidden_layers=L, hidden_size=64, intermediate_size=96, num_attention_heads=8,
                     num_key_value_heads=2, vocab_size=V, num_local_experts=4, num_experts_per_tok=2,
                     tie_word_embeddings=False),
                dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V,
                     position_embedding_type="rotary", swiglu=True, ffn_hidden_size=96, normalization="rmsnorm",
                     num_key_value_heads=2, untie_embeddings_and_output_weights=True, add_bias_linear=False,
                     num_experts=(4,), expert_interval=1, topk=2)),
}


@pytest.mark.parametrize("name", MODELS)
def test_components_equal_transformers_models(name):
    transformers = pytest.importorskip("transformers")  # the `hf` extra (installed by the `test` extra)
    cls_name, hf_config, shape = MODELS[name]
    cls = getattr(transformers, cls_name)
    with torch.device("meta"):
        model = cls(cls.config_class(**hf_config))
    expected: dict[str, int] = {}
    for n, p in model.named_parameters():  # a tied lm_head is listed once
        expected[hf_component(n)] = expected.get(hf_component(n), 0) + p.numel()
    counts = analytic_parameter_counts(ModelShape(**shape))
    assert {c: n for c, n in counts.components.items() if n} == expected
    embeddings = sum(expected.get(c, 0) for c in ("word_embeddings", "position_embeddings", "output_layer"))
    assert (counts.total, counts.no_embedding) == (sum(expected.values()), sum(expected.values()) - embeddings)
    if name == "mixtral":  # a token passes through 2 of the 4 experts of each layer
        active = sum(expected.values()) - expected["experts"] // 2
        assert (counts.active, counts.active_no_embedding) == (active, active - embeddings)
    else:
        assert (counts.active, counts.active_no_embedding) == (counts.total, counts.no_embedding)


def test_flops_equal_flop_counter_on_transformers_gpt2():
    """FlopCounterMode on transformers' GPT-2 (eager attention: QK^T and PV are matmuls), forward
    and backward (recompute: tests/integration/test_flops.py, on our model)."""
    transformers = pytest.importorskip("transformers")
    cls_name, hf_config, shape = MODELS["gpt2"]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    config = cls.config_class(**hf_config, attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0,
                              attn_pdrop=0.0)
    model = cls(config).train()
    tokens = torch.randint(0, V, (2, S))
    with FlopCounterMode(display=False) as counter:
        model(tokens, labels=tokens).loss.backward()
    assert counter.get_total_flops() == 2 * flops_per_sample(ModelShape(**shape), False)


def test_gigaflos_no_embeds_by_hand():
    # 6 N D: 6 x 1e6 parameters x (10 samples x 100 tokens) = 6e9 FLOPs = 6 GigaFLOs
    assert gigaflos_no_embeds(10, 100, 1_000_000) == 6.0


# --- names, fused parts, experts: by hand on the tiny GPT-2 (2 layers, h 64, 4 heads, seq 32) ---

def tiny(**kw):
    return ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600, **kw)


def test_names_in_gptmodelpipe_and_gptmodel():
    tied, untied = tiny(), tiny(untie_embeddings_and_output_weights=True)
    # GPTModelPipe: DeepSpeed's tied module on every stage holding a copy, then "<layer index>.<key>"
    assert table_entry("tied_modules.embed.word_embeddings.weight", tied, True).component == "word_embeddings"
    assert table_entry("0.word_embeddings.weight", tied, True) is None
    assert table_entry("0.word_embeddings.weight", untied, True).component == "word_embeddings"
    assert table_entry("1.self_attention.query_key_value.weight", tied, True).shape == (3 * 64, 64)
    assert table_entry("3.bias", tied, True).shape == (64,)  # the final norm is layer L + 1
    assert table_entry("4.weight", untied, True).component == "output_layer"  # layer L + 2
    assert table_entry("4.weight", tied, True) is None  # the tied copy is not listed again
    # GPTModel: Megatron's module tree, transformer layers 0-based
    plain = {
        "language_model.embedding.word_embeddings.weight": ("word_embeddings", (640, 64)),
        "language_model.embedding.position_embeddings.weight": ("position_embeddings", (32, 64)),
        "language_model.encoder.layers.0.input_layernorm.weight": ("layernorm", (64,)),
        "language_model.encoder.layers.1.mlp.dense_4h_to_h.weight": ("mlp", (64, 256)),
        "language_model.encoder.final_layernorm.bias": ("layernorm", (64,)),
        "language_model.output_layer.weight": ("output_layer", (640, 64)),
    }
    for name, (component, shape) in plain.items():
        entry = table_entry(name, untied, False)
        assert (entry.component, entry.shape) == (component, shape), name
    assert table_entry("language_model.encoder.layers.2.input_layernorm.weight", untied, False) is None
    assert table_entry("language_model.output_layer.weight", tied, False) is None
    assert len(entries_by_name(untied, False)) == 2 + 2 * 12 + 2 + 1


def test_fused_qkv_and_glu_parts():
    # 4 query heads in 2 kv groups, head dim 2: per group 2 query heads, its key head, its value head
    shape = tiny(num_key_value_heads=2, kv_channels=2)
    qkv = table_entry("language_model.encoder.layers.0.self_attention.query_key_value.weight", shape, False)
    rows = torch.arange(16).repeat_interleave(3).reshape(16, 3)  # row r holds r in each of its 3 columns
    parts = fused_parts(qkv, shape, rows)
    assert sorted(parts) == ["key", "query", "value"]
    assert parts["query"][:, 0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11] and parts["query"].shape == (8, 3)
    assert parts["key"][:, 1].tolist() == [4, 5, 12, 13] and parts["value"][:, 2].tolist() == [6, 7, 14, 15]
    bias = table_entry("language_model.encoder.layers.0.self_attention.query_key_value.bias", shape, False)
    assert fused_parts(bias, shape, torch.arange(16))["value"].tolist() == [6, 7, 14, 15]
    glu = tiny(glu_activation="swiglu", ffn_hidden_size=4)
    h_to_4h = table_entry("language_model.encoder.layers.0.mlp.dense_h_to_4h.weight", glu, False)
    parts = fused_parts(h_to_4h, glu, torch.arange(8))  # rows alternate gate, value
    assert (parts["gate"].tolist(), parts["value"].tolist()) == ([0, 2, 4, 6], [1, 3, 5, 7])
    dense = table_entry("language_model.encoder.layers.0.mlp.dense_4h_to_h.weight", glu, False)
    assert list(fused_parts(dense, glu, torch.arange(3))) == [""]


EXPERT = 64 * 256 + 256 + 256 * 64 + 64  # one expert: the dense MLP, 33,088


def test_experts_held_per_tp_and_ep_rank_by_hand():
    """Layer 2 has 4 experts. TP 2 (vocab 600 padded to a multiple of 128 x 2: 768): a rank holds half
    of the word table and of every column / row-parallel matrix, whole norms, position table, router
    and row-parallel biases; the experts too are halved with --enable-expert-tensor-parallelism."""
    word, positions = 768 * 64 // 2, 32 * 64
    attention_and_norms = 128 + 3 * 64 * 64 // 2 + 3 * 64 // 2 + 64 * 64 // 2 + 64 + 128
    mlp_half = 64 * 256 // 2 + 256 // 2 + 256 * 64 // 2 + 64
    router, final_norm = 4 * 64, 128
    dense_rest = word + positions + (attention_and_norms + mlp_half) + attention_and_norms + router + final_norm

    def held(**kw):
        return analytic_parameter_counts(tiny(tensor_model_parallel_size=2, num_experts=(4,), **kw)).stages[0].held
    assert held() == dense_rest + 4 * EXPERT  # experts whole on every TP rank
    assert held(enable_expert_tensor_parallelism=True) == dense_rest + 4 * mlp_half
    # EP 2: each EP rank holds 2 of the 4 experts (the table counts EP rank 0's)
    assert held(enable_expert_tensor_parallelism=True, moe_expert_parallel_size=2) == dense_rest + 2 * mlp_half
    ep2 = tiny(num_experts=(4,), moe_expert_parallel_size=2)
    assert experts_per_expert_parallel_rank(ep2) == (2, 2 * EXPERT)
    specs = [s for s in parameter_table(ep2) if s.component == "experts"]
    assert [held_by_expert_parallel_rank(ep2, s, 1) for s in specs] == [False] * 8 + [True] * 8  # 4 tensors each
    assert all(held_by_expert_parallel_rank(ep2, s, 1) for s in parameter_table(ep2) if s.component != "experts")


def test_active_parameters_top_k_and_residual_moe():
    # top-2 of 4 experts in layer 2, 8 in layer 4 (interval 2): 2 experts per MoE layer are active
    shape = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                       num_experts=(4, 8), topk=2)
    counts = analytic_parameter_counts(shape)
    assert counts.components["experts"] == 12 * EXPERT and counts.experts_active == 4 * EXPERT
    assert counts.active == counts.total - 8 * EXPERT
    assert experts_per_expert_parallel_rank(shape) == (12, 12 * EXPERT)
    # PR-MoE: the dense MLP stays next to the experts, mixed by a coefficient h -> 2 with bias
    residual = analytic_parameter_counts(tiny(num_experts=(4,), mlp_type="residual"))
    assert residual.components["mlp"] == 2 * EXPERT and residual.components["router"] == 4 * 64 + 2 * 64 + 2
    # FLOPs of layer 2's MLP slot per sample: one expert (top-1) 4shf, the router 2shE, the dense MLP
    # again and the coefficient 2sh2
    s, h, f = 32, 64, 256
    assert mlp_forward_flops(tiny(num_experts=(4,), mlp_type="residual")) == [
        4 * s * h * f, 4 * s * h * f + 2 * s * h * 4 + 4 * s * h * f + 2 * s * h * 2]


def test_stage_counts_and_pipe_items_at_pp2():
    shape = tiny(pipeline_model_parallel_size=2)
    embedding, layer = (640 + 32) * 64, 12 * 64 * 64 + 13 * 64  # word + position tables; one GPT-2 layer
    # the last stage holds layer 2, the final norm and a copy of the embedding (owned by stage 0)
    assert analytic_parameter_counts(shape).stages == (StageCount(1, embedding + layer, embedding + layer),
                                                       StageCount(1, layer + 128 + embedding, layer + 128))
    s, h, f, v = 32, 64, 256, 640
    layer_flops = 2 * s * h * 3 * h + 4 * s * s * h + 2 * s * h * h + 4 * s * h * f
    assert [(i.layer, i.params, i.flops) for i in pipe_items(shape)] == [
        (0, embedding, 0), (1, layer, 3 * layer_flops), (2, layer, 3 * layer_flops), (3, 128, 0),
        (4, embedding, 3 * 2 * s * h * v)]
    assert layers_per_stage(shape) == [1, 1] and [stage_of_layer(shape, n) for n in range(5)] == [0, 0, 1, 1, 1]


def test_block_recompute_per_stage():
    """The block method recomputes the first N layers of each stage: at PP 2 over 4 layers with
    N = 1, layers 0 and 2; N = 5 is capped at each stage's 2 layers."""
    shape = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                       pipeline_model_parallel_size=2)
    assert recomputed_layers(shape, "block", 1) == [0, 2]
    assert recomputed_layers(shape, "block", 5) == [0, 1, 2, 3] == recomputed_layers(shape, "uniform", 1)
    assert recomputed_layers(shape, None, 1) == []
    three = ModelShape(num_layers=6, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                       pipeline_model_parallel_size=3)
    assert recomputed_layers(three, "block", 1) == [0, 2, 4]  # stages of layers 0-1, 2-3, 4-5
    s, h, f, v = 32, 64, 256, 640
    layer = 2 * s * h * 3 * h + 4 * s * s * h + 2 * s * h * h + 4 * s * h * f
    logits = 2 * s * h * v
    assert flops_per_sample(shape, True, "block", 1) == 3 * 4 * layer + 2 * layer + 3 * logits
    assert flops_per_sample(shape, True) == 4 * 4 * layer + 3 * logits  # uniform by default
    assert flops_per_sample(shape, False, "block", 1) == 3 * 4 * layer + 3 * logits  # no checkpointing


def test_last_stage_copy_and_untied_output_at_tp2():
    # the last stage's copy of the embedding has no embedding LayerNorm (only the first stage runs it)
    bloom_like = tiny(pipeline_model_parallel_size=2, embed_layernorm=True)
    embedding, layer = (640 + 32) * 64, 12 * 64 * 64 + 13 * 64
    assert [s.held for s in analytic_parameter_counts(bloom_like).stages] == [
        embedding + 128 + layer, layer + 128 + embedding]
    # TP 2 (vocab padded to 768): the untied output layer is split over the vocab like the embedding
    untied = tiny(tensor_model_parallel_size=2, untie_embeddings_and_output_weights=True)
    [stage] = analytic_parameter_counts(untied).stages
    local_layer = 128 + 3 * 64 * 64 // 2 + 3 * 64 // 2 + 64 * 64 // 2 + 64 + 128 + 64 * 256 + 256 // 2 + 64
    assert stage.held == 768 * 64 // 2 + 32 * 64 + 2 * local_layer + 128 + 768 * 64 // 2
    assert type(stage.held) is int


def test_layers_of_exactly_two_experts():
    # 2 experts is an MoE layer (e > 1): top-1 of 2, EP 2 holds one each
    shape = tiny(num_experts=(2,), moe_expert_parallel_size=2)
    assert analytic_parameter_counts(shape).experts_active == EXPERT
    experts, params = experts_per_expert_parallel_rank(shape)
    assert (experts, params) == (1, EXPERT) and type(experts) is int


def test_gptmodel_names_of_an_embedding_layernorm_and_pr_moe_model():
    """Megatron's module tree with DeepSpeed's MoE module in layer 2's MLP slot (PR-MoE: the experts,
    the router `deepspeed_moe.gate.wg`, the dense MLP `mlp` and the mixing `coefficient`)."""
    shape = tiny(embed_layernorm=True, num_experts=(2,), mlp_type="residual")
    dense = ["input_layernorm.weight", "input_layernorm.bias", "self_attention.query_key_value.weight",
             "self_attention.query_key_value.bias", "self_attention.dense.weight", "self_attention.dense.bias",
             "post_attention_layernorm.weight", "post_attention_layernorm.bias"]
    mlp = ["dense_h_to_4h.weight", "dense_h_to_4h.bias", "dense_4h_to_h.weight", "dense_4h_to_h.bias"]
    expected = ([f"language_model.embedding.{k}" for k in ("word_embeddings.weight", "position_embeddings.weight",
                                                            "embedding_layernorm.weight", "embedding_layernorm.bias")]
                + [f"language_model.encoder.layers.0.{k}" for k in dense + [f"mlp.{m}" for m in mlp]]
                + [f"language_model.encoder.layers.1.{k}" for k in dense + ["mlp.deepspeed_moe.gate.wg.weight"]]
                + [f"language_model.encoder.layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.{e}.{m}"
                   for e in (0, 1) for m in mlp]
                + [f"language_model.encoder.layers.1.mlp.mlp.{m}" for m in mlp]
                + ["language_model.encoder.layers.1.mlp.coefficient.weight",
                   "language_model.encoder.layers.1.mlp.coefficient.bias",
                   "language_model.encoder.final_layernorm.weight", "language_model.encoder.final_layernorm.bias"])
    assert list(entries_by_name(shape, False)) == expected


def test_tp_blocks_of_fused_rows():
    """The rows a TP rank keeps together: a kv group's (a/g query heads + key + value) x head dim rows
    of the QKV weight and bias (4 heads in 2 groups of head dim 16: 64), a GLU's gate/value pair (2),
    single rows elsewhere; a row-parallel bias is replicated."""
    shape = tiny(num_key_value_heads=2, glu_activation="swiglu")
    specs = {s.key: s for s in parameter_table(shape) if s.layer == 1}
    assert [(specs[k].split, specs[k].block) for k in (
        "self_attention.query_key_value.weight", "self_attention.query_key_value.bias", "self_attention.dense.weight",
        "self_attention.dense.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight",
        "mlp.dense_4h_to_h.bias")] == [("column", 64), ("column", 64), ("row", 1), ("replicated", 1),
                                       ("column", 2), ("column", 2), ("row", 1), ("replicated", 1)]


def test_moe_mlp_flops_and_the_tied_copys_item():
    s, h, f = 32, 64, 256
    # standard MoE (top-1): one expert's 4shf and the router 2shE; 2 experts is an MoE layer too
    assert mlp_forward_flops(tiny(num_experts=(4,))) == [4 * s * h * f, 4 * s * h * f + 2 * s * h * 4]
    assert mlp_forward_flops(tiny(num_experts=(2,))) == [4 * s * h * f, 4 * s * h * f + 2 * s * h * 2]
    # the last stage's tied copy is weighed without the embedding LayerNorm
    copy = pipe_items(tiny(embed_layernorm=True))[-1]
    assert (copy.layer, copy.params) == (4, (640 + 32) * 64)
    # the block method recomputes the first layer of each stage when N is not given
    shape = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                       pipeline_model_parallel_size=2)
    assert flops_per_sample(shape, True, "block") == flops_per_sample(shape, True, "block", 1)
    assert flops_per_sample(shape, True, "block") != flops_per_sample(shape, True, "block", 2)


def test_qkv_bias_only_and_flops_at_a_curriculum_length_by_hand():
    """--disable-bias-linear --add-qkv-bias (Qwen2): only the QKV projection has a bias (3h per layer);
    FLOPs per sample at a shorter trained length s' are the formula's terms at s', worked by hand."""
    h, layers, v = 64, 2, 256
    base = dict(num_layers=layers, hidden_size=h, num_attention_heads=4, vocab_size=v, seq_length=32)
    no_bias = analytic_parameter_counts(ModelShape(**base, add_bias_linear=False)).components["attention"]
    qkv_bias = analytic_parameter_counts(ModelShape(**base, add_bias_linear=False, add_qkv_bias=True))
    assert no_bias == layers * 4 * h * h
    assert qkv_bias.components["attention"] == layers * (4 * h * h + 3 * h)
    shape = ModelShape(**base)
    for s in (8, 32):
        layer = 24 * s * h * h + 4 * s * s * h  # QKV, scores + context, projection, 4h MLP
        assert flops_per_sample(shape, False, seq_length=s) == 3 * (layers * layer + 2 * s * h * v)
