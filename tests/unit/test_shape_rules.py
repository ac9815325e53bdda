"""megatron/model/shape.py's rules one at a time, in-process and torch-free (survivors of the
mutation run, benchmarks/mutation.sh): every refusal's whole line written out here, the defaults a
shape fills in, the experts of each layer, the pipe's layer list and the variant's description.
tests/integration/test_flag_validation.py checks that the trainer's entry point names the flag; this file
holds the wording and the boundaries (a value exactly at a limit is accepted)."""
from types import SimpleNamespace

import pytest

from megatron.model.shape import (
    ModelShape,
    _num_key_value_heads,
    _position_embedding_type,
    gpt2_variant,
    pad_vocab_size,
    swiglu_ffn_hidden_size,
)
from megatron.runtime.refusal import ConfigError, require_fraction, require_non_negative, require_positive

BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32)


def shape(**kw):
    return ModelShape(**{**BASE, **kw})


REFUSALS = [
    (dict(num_layers=None), "--num-layers is required"),
    (dict(seq_length=None), "--seq-length is required"),
    (dict(hidden_size=0), "--hidden-size 0 must be positive"),
    (dict(num_attention_heads=-1), "--num-attention-heads -1 must be positive"),
    (dict(position_embedding_type="learned"), "--position-embedding-type learned: choose absolute, rotary or alibi"),
    (dict(swiglu=True, glu_activation="geglu"), "--swiglu contradicts --glu-activation geglu: drop one of them"),
    (dict(glu_activation="relu"), "--glu-activation relu: choose one of geglu, liglu, reglu, swiglu"),
    (dict(normalization="batchnorm"), "--normalization batchnorm: choose layernorm or rmsnorm"),
    (dict(activation="relu"), "activation relu: choose one of gelu, openai_gelu, squared_relu"),
    (dict(swiglu=True, hidden_size=16),
     "--swiglu: the default ffn size int(8 x --hidden-size 16 / 3 / 64) x 64 is 0; pass --ffn-hidden-size"),
    (dict(hidden_size=66), "--hidden-size 66 is not divisible by --num-attention-heads 4: choose heads that divide "
                           "the hidden size, or give --kv-channels"),
    (dict(ffn_hidden_size=0), "--ffn-hidden-size 0 must be positive"),
    (dict(max_position_embeddings=0), "--max-position-embeddings 0 must be positive"),
    (dict(make_vocab_size_divisible_by=0), "--make-vocab-size-divisible-by 0 must be positive"),
    (dict(num_key_value_heads=0), "--num-key-value-heads 0 must be positive"),
    (dict(kv_channels=0), "--kv-channels 0 must be positive"),
    (dict(vocab_size=0), "--vocab-size 0 must be positive"),
    (dict(tensor_model_parallel_size=0), "--tensor-model-parallel-size 0 must be positive"),
    (dict(pipeline_model_parallel_size=0), "--pipeline-model-parallel-size 0 must be positive"),
    (dict(tensor_model_parallel_size=3), "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3: "
                                         "use a TP size that divides the head count"),
    (dict(num_key_value_heads=3), "--num-key-value-heads 3 does not divide --num-attention-heads 4: every key/value "
                                  "head serves the same number of query heads"),
    (dict(num_key_value_heads=1, tensor_model_parallel_size=2),
     "--num-key-value-heads 1 is not divisible by --tensor-model-parallel-size 2: use a TP size that divides the "
     "key/value head count (multi-query attention needs TP=1)"),
    (dict(position_embedding_type="rotary", kv_channels=3),
     "--kv-channels 3 is odd: rotary embeddings rotate pairs of channels"),
    (dict(rotary_percent=0), "--rotary-percent 0 must be in (0, 1]"),
    (dict(rotary_percent=1.5), "--rotary-percent 1.5 must be in (0, 1]"),
    (dict(position_embedding_type="rotary", rotary_percent=0.1),  # int(16 x 0.1) = 1
     "--rotary-percent 0.1 of head dim 16 gives 1 rotary channels: rotary rotates pairs of channels, so "
     "int(head dim x p) must be even and > 0"),
    (dict(position_embedding_type="rotary", rotary_percent=0.05),  # int(0.8) = 0
     "--rotary-percent 0.05 of head dim 16 gives 0 rotary channels: rotary rotates pairs of channels, so "
     "int(head dim x p) must be even and > 0"),
    (dict(pad_vocab_size_to=0), "--pad-vocab-size-to 0 must be positive"),
    (dict(pad_vocab_size_to=1000), "--pad-vocab-size-to 1000 is not divisible by --make-vocab-size-divisible-by 128: "
                                   "choose a multiple of it"),
    (dict(pad_vocab_size_to=1001, make_vocab_size_divisible_by=1, tensor_model_parallel_size=2),
     "--pad-vocab-size-to 1001 is not divisible by --tensor-model-parallel-size 2: every TP rank holds the same "
     "number of vocab rows"),
    (dict(pad_vocab_size_to=512, vocab_size=600),
     "--pad-vocab-size-to 512 is below the tokenizer's 600 tokens: pad to at least that"),
    (dict(ffn_hidden_size=255, tensor_model_parallel_size=2),
     "--ffn-hidden-size 255 is not divisible by --tensor-model-parallel-size 2"),
    (dict(pipeline_model_parallel_size=3),
     "--num-layers 2 is smaller than --pipeline-model-parallel-size 3: every pipeline stage needs at least one "
     "transformer layer; lower PP or add layers"),
    (dict(seq_length=64, max_position_embeddings=32),
     "--seq-length 64 exceeds --max-position-embeddings 32: raise --max-position-embeddings or shorten the sequence"),
    (dict(vocab_size=600, embed_layernorm=True, pipeline_model_parallel_size=2, pp_partition_method="Parameters"),
     "--pp-partition-method parameters with --embed-layernorm at PP > 1 splits differently on different stages in "
     "DeepSpeed; use flops or type:transformer|embedding"),
    (dict(vocab_size=600, pp_partition_method="type:attention|moe"),
     "--pp-partition-method type:attention|moe matches none of the layers (EmbeddingPipe, LayerNorm, "
     "ParallelTransformerLayerPipe); use type:transformer (the default), flops, uniform, parameters, type:REGEX"),
    (dict(vocab_size=600, pp_partition_method="random"),
     "--pp-partition-method random is unknown; use type:transformer (the default), flops, uniform, parameters, "
     "type:REGEX"),
    (dict(expert_interval=0), "--expert-interval 0 must be >= 1"),
    (dict(num_layers=4, num_experts=(4, 4, 4)),
     "--num-experts takes one value or one per MoE layer (2 with --num-layers 4 --expert-interval 2); got 3"),
    (dict(num_experts=(0,)), "--num-experts [0] must be >= 1"),
    (dict(num_experts=(4,), moe_expert_parallel_size=0), "--moe-expert-parallel-size 0 must be >= 1"),
    (dict(mlp_type="dense"), "--mlp-type dense: use standard or residual"),
    (dict(topk=0), "--topk 0 must be >= 1"),
    (dict(num_experts=(4,), moe_expert_parallel_size=3),
     "--num-experts 4 is not divisible by --moe-expert-parallel-size 3: every expert-parallel rank holds the same "
     "number of experts"),
    (dict(num_experts=(4,), topk=5), "--topk 5 exceeds --num-experts 4"),
    (dict(moe_expert_parallel_size=2), "--moe-expert-parallel-size 2 needs MoE layers (--num-experts > 1)"),
]


@pytest.mark.parametrize("kw, message", REFUSALS, ids=[m[:40] for _, m in REFUSALS])
def test_refusal_lines(kw, message):
    with pytest.raises(ConfigError) as e:
        shape(**kw)
    assert str(e.value) == message


def test_a_bad_regex_is_named():
    with pytest.raises(ConfigError, match=r"^--pp-partition-method type:\[: not a regular expression \("):
        shape(vocab_size=600, pp_partition_method="type:[")


@pytest.mark.parametrize("kw", [
    dict(pipeline_model_parallel_size=2),                                    # PP = layers
    dict(seq_length=48, max_position_embeddings=48),                         # seq = positions
    dict(pad_vocab_size_to=640, vocab_size=640),                             # padded to exactly the vocab
    dict(rotary_percent=1.0, position_embedding_type="rotary"),
    dict(position_embedding_type="rotary", rotary_percent=0.125),           # int(16 x 0.125) = 2
    dict(swiglu=True, glu_activation="swiglu"),
    dict(num_experts=(2,), topk=2, moe_expert_parallel_size=2),             # top-k = experts, EP = experts
    dict(vocab_size=600, pp_partition_method="FLOPS"), dict(vocab_size=600, pp_partition_method="Uniform"),
    dict(vocab_size=600, pp_partition_method="parameters", embed_layernorm=True),  # PP 1: one stage
    dict(vocab_size=600, pp_partition_method="TYPE:TRANSFORMER"),           # the regex ignores case
    dict(pp_partition_method="random"),  # the method is checked once the vocab is known
])
def test_accepted_at_the_limits(kw):
    shape(**kw)


def test_defaults_a_shape_fills_in():
    s = shape(position_embedding_type="rope", normalization="RMSNorm")
    assert (s.ffn_hidden_size, s.max_position_embeddings, s.num_key_value_heads, s.kv_channels, s.head_dim) == (
        256, 32, 4, 16, 16)
    assert (s.position_embedding_type, s.normalization, s.rotary_dim) == ("rotary", "rmsnorm", 16)
    assert shape(position_embedding_type="learned_absolute").position_embedding_type == "absolute"
    glu = shape(swiglu=True)
    assert (glu.glu_activation, glu.ffn_hidden_size, glu.glu) == ("swiglu", 128, True)  # int(8 x 64 / 3 / 64) x 64
    assert shape(glu_activation="geglu").ffn_hidden_size == 256 and not shape().glu
    assert shape(kv_channels=24).num_key_value_heads == 4
    assert shape(position_embedding_type="rotary", rotary_percent=0.5).rotary_dim == 8
    assert swiglu_ffn_hidden_size(4096) == 10880  # int(8 x 4096 / 3 / 64) = int(170.67) = 170, x 64
    assert shape(num_experts=[4]).num_experts == (4,)


def test_padded_vocab():
    assert pad_vocab_size(600, 128, 2) == 768 and pad_vocab_size(512, 128, 2) == 512 and pad_vocab_size(1, 1, 1) == 1
    assert shape(vocab_size=600, tensor_model_parallel_size=2).padded_vocab_size == 768
    assert shape(vocab_size=600, pad_vocab_size_to=1024).padded_vocab_size == 1024
    with pytest.raises(AssertionError, match="the vocab size is not known yet"):
        _ = shape().padded_vocab_size


def test_experts_per_layer():
    assert shape(num_layers=4, num_experts=(4, 8)).experts_per_layer() == [1, 4, 1, 8]
    assert shape(num_layers=4, num_experts=(4,)).experts_per_layer() == [1, 4, 1, 4]
    assert shape(num_layers=6, expert_interval=3, num_experts=(2, 4)).experts_per_layer() == [1, 1, 2, 1, 1, 4]
    assert shape(num_layers=3, expert_interval=1, num_experts=(2,)).experts_per_layer() == [2, 2, 2]
    assert shape(num_layers=3, expert_interval=1, num_experts=(2, 4, 8)).experts_per_layer() == [2, 4, 8]
    assert shape(num_experts=(4,)).is_moe and not shape().is_moe and not shape(num_experts=(1,)).is_moe


def test_pipe_layers():
    names = [(p.name, p.kind, p.layer) for p in shape().pipe_layers()]
    assert names == [("EmbeddingPipe", "embedding", 0), ("ParallelTransformerLayerPipe", "transformer", 1),
                     ("ParallelTransformerLayerPipe", "transformer", 2), ("LayerNorm", "norm", 3),
                     ("EmbeddingPipe", "tied_output", 4)]
    moe = shape(num_experts=(4,), normalization="rmsnorm", untie_embeddings_and_output_weights=True).pipe_layers()
    assert [(p.name, p.kind, p.layer) for p in moe[3:]] == [("take", "moe_loss", None), ("RMSNorm", "norm", 3),
                                                            ("OutputLayer", "output", 4)]


def test_describe():
    assert shape(position_embedding_type="rotary", rotary_percent=0.5).describe() == (
        "rotary on 8 of 16 channels, gelu ffn 256, layernorm, 4 heads, tied")
    assert shape(position_embedding_type="none", kv_channels=8, embed_layernorm=True, add_bias_linear=False,
                 untie_embeddings_and_output_weights=True).describe() == (
        "no positions, gelu ffn 256, embed layernorm, layernorm, 4 heads of dim 8, untied, no bias")
    # Qwen2's --disable-bias-linear --add-qkv-bias: the QKV projection keeps its bias
    assert shape(add_bias_linear=False, add_qkv_bias=True).describe() == (
        "learned positions, gelu ffn 256, layernorm, 4 heads, tied, qkv bias only")
    assert shape(position_embedding_type="alibi", num_key_value_heads=2).describe() == (
        "alibi, gelu ffn 256, layernorm, 4 query / 2 kv heads, tied")
    assert gpt2_variant(4, 64) == {
        "position_embedding_type": "absolute", "rotary_percent": 1.0, "glu_activation": None,
        "normalization": "layernorm", "embed_layernorm": False, "add_bias_linear": True, "add_qkv_bias": False,
        "num_key_value_heads": 4, "kv_channels": 16, "untie_embeddings_and_output_weights": False,
        "activation": "gelu", "apply_residual_connection_post_layernorm": False, "apply_layernorm_1p": False}


def test_single_flag_rules():
    for ok in (None, 1, 0.5):
        require_positive("--x", ok)
    require_non_negative("--x", 0)
    require_fraction("--x", 1)
    require_fraction("--x", 0)
    require_fraction("--x", 0, below_one=True)
    for call, message in [(lambda: require_positive("--x", 0), "--x 0 must be positive"),
                          (lambda: require_non_negative("--x", -1), "--x -1 must be >= 0"),
                          (lambda: require_fraction("--x", 1.5), "--x 1.5 must be in [0, 1]"),
                          (lambda: require_fraction("--x", -0.5), "--x -0.5 must be in [0, 1]"),
                          (lambda: require_fraction("--x", 1, below_one=True), "--x 1 must be in [0, 1)")]:
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == message


def flags(**kw):
    return SimpleNamespace(**{"position_embedding_type": None, "use_rotary_position_embeddings": False,
                              "add_position_embedding": True, "group_query_attention": False,
                              "num_query_groups": None, "num_key_value_heads": None, **kw})


def test_both_forks_position_and_kv_head_flags():
    assert _position_embedding_type(flags()) == "absolute"
    assert _position_embedding_type(flags(position_embedding_type="rope")) == "rotary"
    assert _position_embedding_type(flags(use_rotary_position_embeddings=True)) == "rotary"
    assert _position_embedding_type(flags(use_rotary_position_embeddings=True, position_embedding_type="rope")) == (
        "rotary")
    assert _position_embedding_type(flags(add_position_embedding=False)) == "none"
    assert _position_embedding_type(flags(add_position_embedding=False, position_embedding_type="alibi")) == "alibi"
    assert _num_key_value_heads(flags()) is None
    assert _num_key_value_heads(flags(group_query_attention=True)) == 1  # Megatron-LM's default: MQA
    assert _num_key_value_heads(flags(group_query_attention=True, num_query_groups=2)) == 2
    assert _num_key_value_heads(flags(num_key_value_heads=2, group_query_attention=True, num_query_groups=2)) == 2
    assert _num_key_value_heads(flags(num_key_value_heads=4)) == 4
    for kw, message in [
        (dict(use_rotary_position_embeddings=True, position_embedding_type="alibi"),
         "--use-rotary-position-embeddings contradicts --position-embedding-type alibi; drop one"),
        (dict(add_position_embedding=False, position_embedding_type="learned_absolute"),
         "--no-position-embedding contradicts --position-embedding-type learned_absolute; drop one"),
    ]:
        with pytest.raises(ConfigError) as e:
            _position_embedding_type(flags(**kw))
        assert str(e.value) == message
    for kw, message in [
        (dict(num_query_groups=2), "--num-query-groups needs --group-query-attention"),
        (dict(num_key_value_heads=2, group_query_attention=True, num_query_groups=4),
         "--num-key-value-heads 2 contradicts --num-query-groups 4; drop one"),
    ]:
        with pytest.raises(ConfigError) as e:
            _num_key_value_heads(flags(**kw))
        assert str(e.value) == message


def test_describe_learned_and_full_rotary():
    assert shape().describe() == "learned positions, gelu ffn 256, layernorm, 4 heads, tied"
    # --rotary-percent only matters with rotary positions
    assert shape(rotary_percent=0.5).describe() == "learned positions, gelu ffn 256, layernorm, 4 heads, tied"
    assert shape(position_embedding_type="rotary").describe() == "rotary, gelu ffn 256, layernorm, 4 heads, tied"


def trainer_flags(**kw):
    """The trainer's namespace after parsing, every field from_args reads."""
    return flags(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, ffn_hidden_size=None,
                 max_position_embeddings=None, make_vocab_size_divisible_by=128, tensor_model_parallel_size=1,
                 pipeline_model_parallel_size=1, glu_activation=None, swiglu=False, normalization="layernorm",
                 embed_layernorm=False, add_bias_linear=True, kv_channels=None,
                 untie_embeddings_and_output_weights=False, **kw)


def test_from_args_reads_every_field():
    args = trainer_flags()
    for name, value in dict(ffn_hidden_size=96, max_position_embeddings=48, make_vocab_size_divisible_by=64,
                            tensor_model_parallel_size=2, pipeline_model_parallel_size=2, glu_activation="geglu",
                            normalization="rmsnorm", embed_layernorm=True, add_bias_linear=False, kv_channels=8,
                            untie_embeddings_and_output_weights=True, use_rotary_position_embeddings=True,
                            num_key_value_heads=2).items():
        setattr(args, name, value)
    args.pad_vocab_size_to, args.pp_partition_method, args.rotary_percent = 1024, "uniform", 0.5
    args.num_experts, args.expert_interval, args.topk = [4], 1, 2
    args.moe_expert_parallel_size, args.mlp_type, args.enable_expert_tensor_parallelism = 2, "residual", True
    assert ModelShape.from_args(args, vocab_size=600) == ModelShape(
        num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600, ffn_hidden_size=96,
        max_position_embeddings=48, make_vocab_size_divisible_by=64, pad_vocab_size_to=1024,
        tensor_model_parallel_size=2, pipeline_model_parallel_size=2, pp_partition_method="uniform",
        position_embedding_type="rotary", rotary_percent=0.5, glu_activation="geglu", normalization="rmsnorm",
        embed_layernorm=True, add_bias_linear=False, num_key_value_heads=2, kv_channels=8,
        untie_embeddings_and_output_weights=True, num_experts=(4,), expert_interval=1, topk=2,
        moe_expert_parallel_size=2, mlp_type="residual", enable_expert_tensor_parallelism=True)
    # a namespace without the optional flags (nor MoE ones, or left None): the dense GPT-2 defaults
    assert ModelShape.from_args(trainer_flags(num_experts=None, topk=None)) == ModelShape(
        num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=32)
