"""megatron/model/analytic.py in-process, against independent references: transformers' own
models built on the meta device (per-component parameter counts), FlopCounterMode on a real
transformers GPT-2 forward + backward (the FLOPs formula, with and without recompute), and hand
derivations (names, fused parts, placement, expert parallelism, recompute sets, C = 6ND)."""
import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from megatron.model.analytic import (
    analytic_parameter_counts,
    flops_per_sample,
    gigaflos_no_embeds,
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
    "gpt2": (transformers.GPT2LMHeadModel,
             dict(n_layer=L, n_embd=64, n_head=8, n_positions=S, vocab_size=V),
             dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V)),
    "bloom": (transformers.BloomForCausalLM,  # ALiBi, embedding LayerNorm, tied
              dict(n_layer=L, hidden_size=48, n_head=6, vocab_size=V),
              dict(num_layers=L, hidden_size=48, num_attention_heads=6, seq_length=S, vocab_size=V,
                   position_embedding_type="alibi", embed_layernorm=True)),
    "llama": (transformers.LlamaForCausalLM,  # rotary, SwiGLU, RMSNorm, GQA, untied, no bias
              dict(num_hidden_layers=L, hidden_size=64, intermediate_size=160, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=V, tie_word_embeddings=False),
              dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V,
                   position_embedding_type="rotary", swiglu=True, ffn_hidden_size=160, normalization="rmsnorm",
                   num_key_value_heads=2, untie_embeddings_and_output_weights=True, add_bias_linear=False)),
    "llama_head_dim": (transformers.LlamaForCausalLM,  # head dim 24 != h / heads, biased linears
                       dict(num_hidden_layers=L, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=4, head_dim=24, attention_bias=True, mlp_bias=True, vocab_size=V,
                            tie_word_embeddings=False),
                       dict(num_layers=L, hidden_size=64, num_attention_heads=4, seq_length=S, vocab_size=V,
                            position_embedding_type="rotary", swiglu=True, ffn_hidden_size=128,
                            normalization="rmsnorm", kv_channels=24, untie_embeddings_and_output_weights=True)),
    "mqa": (transformers.GPTBigCodeForCausalLM,  # learned positions, one kv head
            dict(n_layer=L, n_embd=64, n_head=8, n_positions=S, vocab_size=V, multi_query=True),
            dict(num_layers=L, hidden_size=64, num_attention_heads=8, seq_length=S, vocab_size=V,
                 num_key_value_heads=1)),
    "mixtral": (transformers.MixtralForCausalLM,  # every layer MoE: 4 SwiGLU experts, top-2, router h -> E
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
    cls, hf_config, shape = MODELS[name]
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
    and backward (recompute: tests/test_flops.py, on our model)."""
    cls, hf_config, shape = MODELS["gpt2"]
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
