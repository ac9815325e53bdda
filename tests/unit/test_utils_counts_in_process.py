"""megatron/utils.py in this process, on a gloo world of one (TP = PP = DP = 1): the measured
counts of a built GPTModel (dense, untied, rotary, MoE) against a plain sum over its parameters by
name, the ownership rule, the refusals of match_parameters_to_table, every name
cache_parameter_counts sets and the startup report's lines, written out by hand. The multi-rank
tests (test_seed_counts, test_moe, ...) cover the layouts; these let mutation testing
(benchmarks/mutation.sh) see the same functions, which it cannot in spawned ranks."""
import dataclasses
import os
from argparse import Namespace

import pytest
import torch

from megatron.model.analytic import COMPONENTS, ParameterCounts, StageCount
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError
from tests.support.model_fixtures import tiny_config

# tiny_config's model: L 2, h 32, 4 heads, s 16, V 128, ffn 4h = 128
L, H, S, V, F = 2, 32, 16, 128, 128
LAYER = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H  # attention + mlp + two LayerNorms = 25,280 / 2
EXPERT = 2 * H * F + F + H  # one expert MLP: 8,352
DENSE_SHAPE = dict(num_layers=L, hidden_size=H, num_attention_heads=4, vocab_size=V, seq_length=S)


@pytest.fixture(scope="module")
def mpu():
    """A one-rank gloo world with DeepSpeed's comm and the model-parallel groups, as the launched
    ranks have it (tests/support/distributed.py); torn down so the next module starts clean."""
    import deepspeed

    from megatron import mpu as megatron_mpu
    from megatron.training.initialize import disable_deepspeed_shm_comm
    from tests.support.launch import free_port
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    disable_deepspeed_shm_comm()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    megatron_mpu.initialize_model_parallel(1, 1, 1)
    # an earlier world of this process (pretrain_gpt.main run in-process by a test) may have left its own
    _forget_deepspeed_expert_groups()
    yield megatron_mpu
    torch.distributed.destroy_process_group()
    _forget_deepspeed_expert_groups()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _forget_deepspeed_expert_groups():
    """DeepSpeed caches its expert groups by EP size: forget them with the world they belong to, or
    the next world of this process (another module, mutmut's next run) finds the dead ones."""
    from deepspeed.utils import groups
    for cache in (groups._EXPERT_PARALLEL_GROUP, groups._EXPERT_PARALLEL_GROUP_RANKS,
                  groups._EXPERT_DATA_PARALLEL_GROUP, groups._EXPERT_DATA_PARALLEL_GROUP_RANKS):
        cache.clear()


def _build(**overrides):
    from megatron.model.gpt_model import GPTModel
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    config = tiny_config(**overrides)
    if config.shape.is_moe:
        create_expert_groups(config.shape)
    model = GPTModel(config, seed=1)
    if config.shape.is_moe:
        attach_expert_groups(model)
    return config.shape, model


def _by_name(model, *parts):
    """Elements of the parameters whose name contains any of `parts` (a plain sum, not the table)."""
    return sum(p.numel() for name, p in model.named_parameters() if any(part in name for part in parts))


def _components(**nonzero):
    return {name: nonzero.get(name, 0) for name in COMPONENTS}


@pytest.mark.parametrize("overrides", [{}, {"untie_embeddings_and_output_weights": True},
                                       {"position_embedding_type": "rotary"}])
def test_dense_counts_equal_a_plain_sum_over_the_built_model(mpu, overrides):
    from megatron.utils import compute_parameter_counts, count_local_parameters, is_moe_model, moe_parameter_owner
    shape, model = _build(**overrides)
    assert not is_moe_model(model) and moe_parameter_owner(model, mpu) is None
    total = sum(p.numel() for p in model.parameters())  # a tied tensor once
    components = _components(
        word_embeddings=_by_name(model, "word_embeddings"), position_embeddings=_by_name(model, "position_embeddings"),
        attention=_by_name(model, "self_attention"), mlp=_by_name(model, ".mlp."),
        layernorm=_by_name(model, "layernorm"), output_layer=_by_name(model, "output_layer"))
    assert sum(components.values()) == total
    # by hand: the word table V x h, learned positions s x h unless rotary, the untied output V x h
    assert components["word_embeddings"] == V * H
    assert components["position_embeddings"] == (0 if overrides.get("position_embedding_type") else S * H)
    assert components["output_layer"] == (V * H if overrides.get("untie_embeddings_and_output_weights") else 0)
    assert components["layernorm"] == (2 * L + 1) * 2 * H
    counts = compute_parameter_counts(model, mpu, shape)
    assert counts == ParameterCounts(components, (StageCount(L, total, total),), 0)
    # TP rank 1's view of the same model: only the TP-split tensors count; all are held, 2 layers
    split = sum(p.numel() for p in model.parameters() if getattr(p, "tensor_model_parallel", False))
    assert 0 < split < total
    owned, local, layers = count_local_parameters(model, 1, shape)
    assert (sum(owned.values()), local, layers) == (split, total, L)
    assert list(owned) == list(COMPONENTS)
    assert all(type(v) is int for v in (*counts.components.values(), *counts.stages[0]))  # int64, not float


def test_moe_counts_equal_a_plain_sum_over_the_built_model(mpu):
    from megatron.utils import compute_parameter_counts, is_moe_model, moe_parameter_owner
    # layer 2 is PR-MoE: 4 experts, top-2, a dense MLP and its coefficient next to them
    shape, model = _build(num_experts=(4,), topk=2, mlp_type="residual")
    assert is_moe_model(model)
    owned = moe_parameter_owner(model, mpu)
    assert all(owned(p) for p in model.parameters())  # one rank owns everything
    total = sum(p.numel() for p in model.parameters())
    experts = _by_name(model, "deepspeed_experts")
    router = _by_name(model, "gate.wg", "coefficient")
    assert (experts, router) == (4 * EXPERT, 4 * H + 2 * H + 2)
    components = _components(
        word_embeddings=V * H, position_embeddings=S * H, attention=_by_name(model, "self_attention"),
        mlp=_by_name(model, "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),  # not the experts'
        layernorm=_by_name(model, "layernorm"), experts=experts, router=router)
    assert components["mlp"] == 2 * EXPERT and sum(components.values()) == total
    counts = compute_parameter_counts(model, mpu, shape)
    # active: top-2 of the layer's 4 equal experts
    assert counts == ParameterCounts(components, (StageCount(L, total, total),), 2 * EXPERT)


def test_moe_counts_of_two_moe_layers_and_top_1(mpu):
    from megatron.utils import compute_moe_parameter_counts
    shape, model = _build(num_layers=4, num_experts=(2, 4))  # layers 2 and 4: 2 and 4 experts, top-1
    counts = compute_moe_parameter_counts(model, mpu, shape)
    assert counts.components["experts"] == 6 * EXPERT == _by_name(model, "deepspeed_experts")
    assert counts.experts_active == 2 * EXPERT
    assert counts.stages == (StageCount(4, sum(p.numel() for p in model.parameters()), counts.total),)
    assert all(type(v) is int for v in (*counts.components.values(), *counts.stages[0], counts.experts_active))


@pytest.mark.parametrize("num_layers, interval", [(1, 1), (3, 2)])
def test_moe_counts_of_a_first_or_middle_moe_layer(mpu, num_layers, interval):
    from megatron.utils import compute_parameter_counts
    # one MoE layer of 4 experts, top-1: the only layer (1 of 1) or one with a dense layer after it (2 of 3)
    shape, model = _build(num_layers=num_layers, expert_interval=interval, num_experts=(4,))
    counts = compute_parameter_counts(model, mpu, shape)
    assert (counts.components["experts"], counts.experts_active) == (4 * EXPERT, EXPERT)
    assert counts.stages == (StageCount(num_layers, sum(p.numel() for p in model.parameters()), counts.total),)


def test_ownership_rule():
    from megatron.utils import _numel, is_owned_parameter
    replicated, split, copy = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    split.tensor_model_parallel = True
    copy.ds_pipe_replicated, copy.tensor_model_parallel = True, True
    assert [is_owned_parameter(p, 0) for p in (replicated, split, copy)] == [True, True, False]
    assert [is_owned_parameter(p, 1) for p in (replicated, split, copy)] == [False, True, False]
    assert _numel(replicated) == 3
    replicated.ds_numel = 12  # ZeRO-3: the full size, not the local shard
    assert _numel(replicated) == 12


def test_match_parameters_to_table_refuses_unlisted_and_misshapen_parameters(mpu):
    from megatron.utils import match_parameters_to_table
    shape, model = _build()
    entries = match_parameters_to_table(model, shape)
    assert len(entries) == len(list(model.parameters()))
    qkv = model.language_model.encoder.layers[0].self_attention.query_key_value.weight
    assert entries[id(qkv)].component == "attention"
    flags = ("num_layers=2 hidden_size=32 num_attention_heads=4 seq_length=16 vocab_size=128 ffn_hidden_size=128 "
             "max_position_embeddings=16 num_key_value_heads=4 kv_channels=8")
    model.register_parameter("extra", torch.nn.Parameter(torch.zeros(2, 3)))
    with pytest.raises(ConfigError) as error:
        match_parameters_to_table(model, shape)
    assert str(error.value) == ("the built model holds extra (2, 3) that the parameter table "
                                f"(megatron/model/analytic.py) does not list ({flags})")
    del model.extra
    wider = dataclasses.replace(shape, ffn_hidden_size=64)
    with pytest.raises(ConfigError) as error:
        match_parameters_to_table(model, wider)
    assert str(error.value) == (
        "mlp: the built language_model.encoder.layers.0.mlp.dense_h_to_4h.weight has shape (128, 32), the "
        f"parameter table (64, 32) ({flags.replace('ffn_hidden_size=128', 'ffn_hidden_size=64')})")


class _Curriculum:
    """The one method cache_parameter_counts reads of megatron/schedules/curriculum.py's schedule."""

    def seqlens(self):
        return (8, 16)


def _forward_flops_per_token(s, layers=L):
    """By hand: QKV 2 x 3h^2, dense 2h^2, MLP 2 x 2hf, scores and values 2 x 2sh (all s keys) per
    layer, logits 2hV."""
    return layers * (6 * H * H + 2 * H * H + 4 * H * F + 4 * s * H) + 2 * H * V


@pytest.mark.parametrize("curriculum", [None, _Curriculum()])
def test_cache_parameter_counts_sets_every_name(curriculum):
    from megatron.utils import COUNT_CACHE, cache_parameter_counts
    # 4 layers, block recompute of 2: the method and the layer count both change the FLOPs
    shape = ModelShape(num_layers=4, hidden_size=H, num_attention_heads=4, vocab_size=V, seq_length=S)
    counts = ParameterCounts(_components(word_embeddings=4_000, attention=1_500_000_000, experts=600_000_000),
                             (StageCount(2, 7, 9),), 200_000_000)
    args = Namespace(model_shape=shape, checkpoint_activations=True, activations_checkpoint_method="block",
                     checkpoint_num_layers=2, curriculum=curriculum)
    assert cache_parameter_counts(args, counts) is args

    def model_flops(s):  # forward + backward: 3 forwards
        return s * 3 * _forward_flops_per_token(s, 4)

    def recomputed(s):  # and the forward of layers 1-2 once more (not the logits)
        return model_flops(s) + s * (_forward_flops_per_token(s, 2) - 2 * H * V)

    expected = dict(
        parameter_counts=counts, parameter_components=counts.components, parameter_stages=(StageCount(2, 7, 9),),
        parameters=2_100_004_000, parameters_no_embedding=2_100_000_000,
        parameters_in_billions=2.100004, parameters_in_billions_no_embedding=2.1,
        parameters_active=1_700_004_000, parameters_active_no_embedding=1_700_000_000,
        parameters_active_in_billions=1.700004, parameters_active_in_billions_no_embedding=1.7,
        flops_per_sample=recomputed(S), model_flops_per_sample=model_flops(S))
    lengths = (8, 16) if curriculum else (16,)
    expected["flops_per_sample_at"] = {s: recomputed(s) for s in lengths}
    expected["model_flops_per_sample_at"] = {s: model_flops(s) for s in lengths}
    assert set(expected) == set(COUNT_CACHE)
    for name, value in expected.items():  # floats too: x / 1e9 rounds once, as the literal does
        assert getattr(args, name) == value, name
    assert list(args.flops_per_sample_at) == list(lengths)  # sorted
    with pytest.raises(TypeError):  # read-only for the logger
        args.flops_per_sample_at[S] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        args.model_flops_per_sample_at[S] = 0  # type: ignore[index]


def test_check_parameter_counts_names_every_difference():
    from megatron.utils import check_parameter_counts, parameter_count_mismatches
    shape = ModelShape(**DENSE_SHAPE)
    # by hand (tiny_config's model): V h, s h, 2 layers of 4h^2 + 4h and 2hf + f + h, 5 LayerNorms of 2h
    right = ParameterCounts(_components(word_embeddings=4_096, position_embeddings=512, attention=8_448,
                                        mlp=16_704, layernorm=320), (StageCount(2, 30_080, 30_080),))
    assert parameter_count_mismatches(right, shape) == []
    check_parameter_counts(right, shape)  # agrees: nothing raised
    wrong = ParameterCounts(dict(right.components, attention=8_000, layernorm=300), (StageCount(1, 30_080, 29_612),),
                            5)
    problems = ["attention: counted 8,000, formula 8,448", "layernorm: counted 300, formula 320",
                "per-stage layers parameters: counted [1], formula [2]",
                "per-stage owned parameters: counted [29612], formula [30080]",
                "active expert parameters: counted 5, formula 0"]
    assert parameter_count_mismatches(wrong, shape) == problems
    with pytest.raises(ConfigError) as error:
        check_parameter_counts(wrong, shape)
    assert str(error.value) == (
        "the built model disagrees with the parameter table (megatron/model/analytic.py): " + "; ".join(problems)
        + " (num_layers=2 hidden_size=32 num_attention_heads=4 seq_length=16 vocab_size=128 ffn_hidden_size=128 "
        "max_position_embeddings=16 num_key_value_heads=4 kv_channels=8)")
    held = ParameterCounts(right.components, (StageCount(2, 30_081, 30_080),))
    assert parameter_count_mismatches(held, shape) == ["per-stage held parameters: counted [30081], formula [30080]"]


def _dense_counts():
    return ParameterCounts(_components(word_embeddings=4_096, position_embeddings=512, attention=8_448,
                                       mlp=16_704, layernorm=320), (StageCount(2, 30_080, 30_080),))


def test_report_of_the_dense_model():
    from megatron.utils import format_parameter_report
    shape = ModelShape(**DENSE_SHAPE)
    flops = S * 3 * _forward_flops_per_token(S)  # 2,949,120
    assert format_parameter_report(_dense_counts(), shape) == [
        "estimated model parameters: 3.008e-05",
        "estimated model parameters without embeddings: 2.5472e-05",
        "model parameters (exact): 30,080 total, 25,472 without embeddings (TP=1 PP=1, padded vocab 128)",
        "architecture: learned positions, gelu ffn 128, layernorm, 4 heads, tied",
        "  stage | layers | params per TP rank 0 | owned params (all TP ranks)",
        "      0 |      2 |               30,080 | 30,080",
        "  component           | params",
        "  word_embeddings     | 4,096",
        "  position_embeddings | 512",
        "  attention           | 8,448",
        "  mlp                 | 16,704",
        "  layernorm           | 320",
        "FLOPs convention: attention's s^2 terms in full (as both Megatron-DeepSpeed forks count them; "
        "--flops-attention causal halves them as Megatron-LM does)",
        f"FLOPs per sample (model, fwd+bwd): {flops:,}",
    ]
    assert flops == 2_949_120


def test_report_options():
    from megatron.utils import format_parameter_report
    shape = ModelShape(**DENSE_SHAPE)
    layers = S * L * (6 * H * H + 2 * H * H + 4 * H * F + 4 * S * H)  # one forward of the layers
    block = format_parameter_report(_dense_counts(), shape, data_parallel_size=2, checkpoint_activations=True,
                                    checkpoint_method="block", sequence_parallel_size=2)
    assert block[2] == ("model parameters (exact): 30,080 total, 25,472 without embeddings "
                        "(TP=1 PP=1 DP=2 SP=2, padded vocab 128)")
    # block, 1 layer of each stage: one of the two layers' forward again
    flops = 2_949_120 + layers // 2
    assert block[-2:] == [
        f"FLOPs per sample (model, fwd+bwd, recompute of the first 1 layer(s) of each stage): {flops:,}",
        f"FLOPs per sample per SP rank (DeepSpeed-Ulysses, SP=2): {flops // 2:,}"]
    uniform = format_parameter_report(_dense_counts(), shape, checkpoint_activations=True, checkpoint_method="uniform")
    assert uniform[-1] == f"FLOPs per sample (model, fwd+bwd, recompute): {2_949_120 + layers:,}"
    four = ModelShape(**dict(DENSE_SHAPE, num_layers=4))
    two = format_parameter_report(_dense_counts(), four, checkpoint_activations=True, checkpoint_method="block",
                                  checkpoint_num_layers=2)
    flops = S * (3 * _forward_flops_per_token(S, 4) + _forward_flops_per_token(S, 2) - 2 * H * V)
    assert two[-1] == f"FLOPs per sample (model, fwd+bwd, recompute of the first 2 layer(s) of each stage): {flops:,}"
    given = format_parameter_report(_dense_counts(), shape, data_parallel_size=None, flops=123_456_789,
                                    sequence_parallel_size=1)
    assert given[2].endswith("(TP=1 PP=1, padded vocab 128)") and given[-1] == \
        "FLOPs per sample (model, fwd+bwd): 123,456,789"


def test_pipeline_split_lines():
    from megatron.utils import format_parameter_report, pipeline_split_lines
    shape = ModelShape(**DENSE_SHAPE, pipeline_model_parallel_size=2)
    # shares by hand, per token: a layer 26,624 FLOPs forward, the logits 8,192, of 61,440
    assert pipeline_split_lines(shape) == [
        "pipeline split (--pp-partition-method type:transformer, the default: the forks' even spread of the layers):",
        "  stage | holds                              | FLOPs share",
        "      0 | embedding, layer 1                 | 43.33%",
        "      1 | layer 2, norm, output layer        | 56.67%",
    ]
    assert pipeline_split_lines(dataclasses.replace(shape, pp_partition_method="uniform")) == [
        "pipeline split (--pp-partition-method uniform):",
        "  stage | holds                              | FLOPs share",
        "      0 | embedding, layers 1-2              | 86.67%",
        "      1 | norm, output layer                 | 13.33%",
    ]
    assert pipeline_split_lines(ModelShape(**DENSE_SHAPE)) == []
    counts = ParameterCounts(_dense_counts().components, (StageCount(1, 17_024, 17_024), StageCount(1, 17_152, 13_056)))
    report = format_parameter_report(counts, shape)
    assert report[4:12] == [
        "  stage | layers | params per TP rank 0 | owned params (all TP ranks)",
        "      0 |      1 |               17,024 | 17,024",
        "      1 |      1 |               17,152 | 13,056",
        "pipeline split (--pp-partition-method type:transformer, the default: the forks' even spread of the layers):",
        "  stage | holds                              | FLOPs share",
        "      0 | embedding, layer 1                 | 43.33%",
        "      1 | layer 2, norm, output layer        | 56.67%",
        "  component           | params",
    ]


def test_moe_report_lines():
    from megatron.utils import format_parameter_report, moe_report_lines
    assert moe_report_lines(_dense_counts(), ModelShape(**DENSE_SHAPE)) == []
    counts = ParameterCounts(_components(word_embeddings=4_000, attention=1_000_000, experts=50_112, router=192),
                             (StageCount(4, 1, 1),), 16_704)
    # layers 2 and 4: 2 and 4 experts split over EP 2, TP-split: 1 + 2 experts of 8,352 per EP rank
    shape = ModelShape(**dict(DENSE_SHAPE, num_layers=4), num_experts=(2, 4), moe_expert_parallel_size=2,
                       enable_expert_tensor_parallelism=True, tensor_model_parallel_size=2)
    assert moe_report_lines(counts, shape) == [
        "estimated active model parameters: 0.001020896",
        "estimated active model parameters without embeddings: 0.001016896",
        "active parameters per token (exact): 1,020,896, 1,016,896 without embeddings "
        "(top-1, MoE layers of [2, 4] experts)",
        "experts per EP rank (EP=2): 3 experts, 25,056 expert parameters (TP-split); expert parameters in all: 50,112",
    ]
    residual = ModelShape(**dict(DENSE_SHAPE, num_layers=4), num_experts=(4,), topk=2, mlp_type="residual")
    lines = moe_report_lines(counts, residual)
    assert lines[2:] == [
        "active parameters per token (exact): 1,020,896, 1,016,896 without embeddings "
        "(top-2, 2 MoE layers of 4 experts, PR-MoE)",
        "experts per EP rank (EP=1): 8 experts, 66,816 expert parameters (whole on each TP rank); "
        "expert parameters in all: 50,112",
    ]
    assert format_parameter_report(counts, residual)[4:8] == lines


def test_table_entry_name_renames_experts_and_pipe_indices():
    from megatron.utils import _table_entry_name
    expert = "mlp.deepspeed_moe.experts.deepspeed_experts."
    # EP rank holding experts 4-7: local expert 1 is global expert 5
    assert _table_entry_name(f"language_model.encoder.layers.1.{expert}1.dense_h_to_4h.weight", 4, None) == \
        f"language_model.encoder.layers.1.{expert}5.dense_h_to_4h.weight"
    assert _table_entry_name(f"layers.1.{expert}1.dense_h_to_4h.weight", 0, None) == \
        f"layers.1.{expert}1.dense_h_to_4h.weight"
    # GPTModelPipe with its MoE loss function at pipe index 4: index 5 and later move back by one
    assert _table_entry_name(f"12.{expert}3.dense_4h_to_h.bias", 8, 4) == f"11.{expert}11.dense_4h_to_h.bias"
    assert _table_entry_name("5.final_layernorm.weight", 0, 4) == "4.final_layernorm.weight"
    assert _table_entry_name("4.input_layernorm.weight", 0, 4) == "4.input_layernorm.weight"
    assert _table_entry_name("3.self_attention.dense.weight", 2, 4) == "3.self_attention.dense.weight"
    assert _table_entry_name("tied_modules.embed.word_embeddings.weight", 0, 4) == \
        "tied_modules.embed.word_embeddings.weight"
    assert _table_entry_name("5.input_layernorm.weight", 0, None) == "5.input_layernorm.weight"


def test_is_moe_model_from_the_flag_or_the_layers(mpu):
    from megatron.utils import is_moe_model
    assert not is_moe_model(torch.nn.Linear(2, 2))  # neither the flag nor a layer
    stage = torch.nn.Linear(2, 2)
    stage.is_moe = True  # a pipeline stage of an MoE model that holds no MoE layer
    assert is_moe_model(stage)
    _, model = _build(num_experts=(2,))
    assert is_moe_model(torch.nn.Sequential(model))  # no flag, an MoE layer inside


# --- another rank's view: this process as TP rank 1, PP stage 1 of 2 or DP rank 1 -----------------
# The ranks are the mpu's answers, the all-reduce runs on the real world of one, so each call returns
# exactly what that rank adds to the sum (the multi-rank tests, test_seed_counts and test_moe, check
# the sums themselves on real layouts).

def _as_rank(mpu, tp=0, stage=0, stages=1, dp=0):
    from types import SimpleNamespace
    return SimpleNamespace(get_tensor_model_parallel_rank=lambda: tp, get_pipeline_model_parallel_rank=lambda: stage,
                           get_pipeline_model_parallel_world_size=lambda: stages, get_data_parallel_rank=lambda: dp,
                           get_model_parallel_group=mpu.get_model_parallel_group)


def _split(model, *, experts=None):
    """Elements of the TP-split (tagged) parameters, optionally only the experts' or only the others'."""
    return sum(p.numel() for name, p in model.named_parameters() if getattr(p, "tensor_model_parallel", False)
               and (experts is None or ("deepspeed_experts" in name) == experts))


def test_dense_contribution_of_another_stage_and_tp_rank(mpu):
    from megatron.utils import compute_parameter_counts
    shape, model = _build()
    total, split = sum(p.numel() for p in model.parameters()), _split(model)
    # stage 1 of 2, TP rank 0: its slot holds (layers, held, owned); stage 0's slot is another rank's
    counts = compute_parameter_counts(model, _as_rank(mpu, stage=1, stages=2), shape)
    assert counts.stages == (StageCount(0, 0, 0), StageCount(L, total, total))
    assert counts.total == total
    # stage 0 of 3, TP rank 1: only the split tensors; layers and held elements are TP rank 0's to give
    counts = compute_parameter_counts(model, _as_rank(mpu, tp=1, stages=3), shape)
    assert counts.stages == (StageCount(0, 0, split), StageCount(0, 0, 0), StageCount(0, 0, 0))
    assert counts.total == split


@pytest.mark.parametrize("expert_tp", [False, True])
def test_moe_contribution_of_another_tp_and_dp_rank(mpu, expert_tp):
    from megatron.utils import compute_parameter_counts, moe_parameter_owner
    shape, model = _build(num_experts=(4,), topk=2, enable_expert_tensor_parallelism=expert_tp)
    total = sum(p.numel() for p in model.parameters())
    experts = 4 * EXPERT
    assert _by_name(model, "deepspeed_experts") == experts
    # DP rank 1 (EDP rank 0 in a world of one): the experts only; E and top-k are DP rank 0's to give
    counts = compute_parameter_counts(model, _as_rank(mpu, dp=1, stage=1, stages=2), shape)
    assert counts.components == _components(experts=experts)
    assert counts.stages == (StageCount(0, 0, 0), StageCount(0, 0, experts)) and counts.experts_active == 0
    # TP rank 1: the dense split tensors and, with expert TP, the experts' split ones (each expert's
    # h -> 4h weight and bias and 4h -> h weight: 2hF + F, not its replicated bias h); without it,
    # each TP rank holds whole experts, counted under its own EDP rank
    expert_share = 4 * (2 * H * F + F) if expert_tp else experts
    owned = moe_parameter_owner(model, _as_rank(mpu, tp=1))
    assert sum(p.numel() for p in model.parameters() if owned(p)) == _split(model, experts=False) + expert_share
    counts = compute_parameter_counts(model, _as_rank(mpu, tp=1), shape)
    assert counts.total == _split(model, experts=False) + expert_share
    assert counts.stages == (StageCount(0, 0, counts.total),) and counts.experts_active == 0
    assert compute_parameter_counts(model, mpu, shape).stages == (StageCount(L, total, total),)


def test_moe_pipe_model_names_after_its_moe_loss_item(mpu):
    """GPTModelPipe with MoE at PP 1 (DeepSpeed's PipelineModule on the world of one): the layers after
    the weightless moe-loss item sit one pipe index later than the table names them; counted the
    same as GPTModel's plain sum."""
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.model.moe import attach_expert_groups, create_expert_groups
    from megatron.utils import compute_parameter_counts, match_parameters_to_table
    config = tiny_config(num_experts=(4,), topk=2)
    create_expert_groups(config.shape)
    model = GPTModelPipe(config, topology=mpu.get_topology(), seed=1)
    attach_expert_groups(model)
    assert getattr(model, "moe_loss", None) is not None
    names = {name.split(".")[0] for name, _ in model.named_parameters()}
    specs = match_parameters_to_table(model, config.shape)
    assert len(specs) == len(list(model.parameters()))
    # the final LayerNorm: pipe index L + 2 (embedding 0, layers 1..L, moe loss L + 1), the table's L + 1
    final = [p for name, p in model.named_parameters() if name.startswith(f"{L + 2}.")]
    assert [p.numel() for p in final] == [H, H] and all(specs[id(p)].component == "layernorm" for p in final)
    assert str(L + 1) not in names
    total = sum(p.numel() for p in model.parameters())
    counts = compute_parameter_counts(model, mpu, config.shape)
    assert (counts.total, counts.components["experts"], counts.experts_active) == (total, 4 * EXPERT, 2 * EXPERT)


# TP rank r's tensors are the TP 1 model's narrowed along the split dimension; by hand, per name
TP2_HALVED_DIM = {"word_embeddings.weight": 0, "query_key_value.weight": 0, "query_key_value.bias": 0,
                  "attention.dense.weight": 1, "dense_h_to_4h.weight": 0, "dense_h_to_4h.bias": 0,
                  "dense_4h_to_h.weight": 1}


def test_match_parameters_to_table_takes_a_tp_rank_slice(mpu):
    """A TP 2 shape: the TP 1 model's tensors are refused where split, and accepted once the split
    ones hold a TP rank's half (vocab 256: padded to 128 x TP at TP 1 and 2 alike)."""
    import dataclasses as dc

    from megatron.utils import match_parameters_to_table
    shape, model = _build(vocab_size=256)
    tp2 = dc.replace(shape, tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match=r"word_embeddings: the built language_model\.embedding\.word_embeddings\."
                                          r"weight has shape \(256, 32\), the parameter table \(128, 32\)"):
        match_parameters_to_table(model, tp2)
    halved = 0
    for name, p in model.named_parameters():
        dim = next((d for suffix, d in TP2_HALVED_DIM.items() if name.endswith(suffix)), None)
        assert (dim is not None) == getattr(p, "tensor_model_parallel", False), name
        if dim is not None:
            p.data = p.data.narrow(dim, 0, p.shape[dim] // 2)
            halved += 1
    assert halved == 1 + 6 * L  # the word table; per layer QKV weight and bias, dense, h->4h weight and bias, 4h->h
    specs = match_parameters_to_table(model, tp2)
    assert len(specs) == len(list(model.parameters()))
    # a replicated tensor (a row-parallel bias) holding half, as if split, is refused
    bias = model.language_model.encoder.layers[0].mlp.dense_4h_to_h.bias
    bias.data = bias.data[:H // 2]
    with pytest.raises(ConfigError, match=r"the built language_model\.encoder\.layers\.0\.mlp\.dense_4h_to_h\.bias "
                                          r"has shape \(16,\), the parameter table \(32,\)"):
        match_parameters_to_table(model, tp2)
