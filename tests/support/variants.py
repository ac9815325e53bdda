"""The matrix of architecture variants the variant tests run, as ModelShape fields on a tiny base
(2 layers, hidden 64, 8 heads, seq 32, vocab 256: a multiple of 128 x TP 2, so every layout pads
it alike and TP=2 holds exactly the TP=1 model)."""

BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=8, seq_length=32, vocab_size=256)

VARIANTS = {
    "gpt2": dict(),
    # ALiBi, embedding LayerNorm, GeLU; 6 heads (not a power of 2: the slope formula's second branch)
    "bloom": dict(position_embedding_type="alibi", embed_layernorm=True, hidden_size=48, num_attention_heads=6),
    # rotary, SwiGLU with the Microsoft fork's ffn default (128 for h 64), RMSNorm, 8 query / 2 kv heads
    "llama": dict(position_embedding_type="rotary", swiglu=True, normalization="rmsnorm", num_key_value_heads=2,
                  untie_embeddings_and_output_weights=True, add_bias_linear=False),
    # Qwen2's: LLaMA's block, tied, a bias on QKV only (Megatron-LM's --disable-bias-linear --add-qkv-bias)
    "qwen2": dict(position_embedding_type="rotary", swiglu=True, normalization="rmsnorm", num_key_value_heads=2,
                  add_bias_linear=False, add_qkv_bias=True),
    "mqa": dict(position_embedding_type="rotary", num_key_value_heads=1),  # TP=1 only
    "kv_channels": dict(kv_channels=24, num_key_value_heads=4, position_embedding_type="none"),
    "geglu_ffn100": dict(glu_activation="geglu", ffn_hidden_size=100),
    "reglu_embed_ln": dict(glu_activation="reglu", embed_layernorm=True, normalization="rmsnorm"),
    "liglu_untied": dict(glu_activation="liglu", untie_embeddings_and_output_weights=True, add_bias_linear=False),
    # issue 39's: the same tensors as GPT-2's (RMSNorm's), another function
    "post_ln_1p_squared_relu": dict(apply_residual_connection_post_layernorm=True, apply_layernorm_1p=True,
                                    activation="squared_relu"),
    "openai_gelu_rmsnorm_1p": dict(activation="openai_gelu", normalization="rmsnorm", apply_layernorm_1p=True),
}
TP2_VARIANTS = [name for name, v in VARIANTS.items() if v.get("num_key_value_heads", 2) % 2 == 0]


def shape_kwargs(name, **overrides):
    return {**BASE, **VARIANTS[name], **overrides}
