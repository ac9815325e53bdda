"""The memory table's rules one at a time, each value worked out by hand (survivors of the mutation
run, benchmarks/mutation.sh): the setup read from the flags and the ds_config, which optimizer
DeepSpeed wraps ours in, each wrapper's bytes for a few hand-sized parameters, SGD's state, the
ZeRO-3 estimate and the byte formatting. In-process, torch-free."""
from types import SimpleNamespace

import pytest

from megatron.metrics.memory import (
    HeldParameter,
    TrainingSetup,
    activation_bytes,
    format_bytes,
    held_parameters,
    layer_activation_bytes,
    model_state_bytes,
)
from megatron.model.shape import ModelShape


def test_setup_from_the_flags_and_the_ds_config():
    args = SimpleNamespace(
        deepspeed_config_dict={"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "overlap_comm": True,
                                                     "sub_group_size": 5000,
                                                     "stage3_param_persistence_threshold": 300},
                               "data_types": {"grad_accum_dtype": "fp32"}},
        zero_stage=None, fp16=False, bf16=True, global_batch_size=24, micro_batch_size=2, data_parallel_size=3,
        no_pipeline_parallel=True, optimizer="sgd", sgd_momentum=0.5, checkpoint_activations=True,
        checkpoint_num_layers=2, activations_checkpoint_method="block", attention_impl="math", hidden_dropout=0.1,
        attention_dropout=0.2, model_shape=SimpleNamespace(is_moe=True))
    assert TrainingSetup.from_args(args, fused_adam=True) == TrainingSetup(
        precision="bf16", zero_stage=2, data_parallel_size=3, micro_batch_size=2, num_micro_batches=4,
        pipeline=False, optimizer="sgd", sgd_momentum=0.5, fused_adam=True, checkpoint_activations=True,
        checkpoint_num_layers=2, checkpoint_method="block", attention_impl="math", hidden_dropout=0.1,
        attention_dropout=0.2, reduce_bucket_size=1000, overlap_comm=True, grad_accum_dtype="fp32", moe=True,
        sub_group_size=5000, param_persistence_threshold=300)
    # the flag's ZeRO stage wins over the ds_config's; no ds_config: DeepSpeed's defaults
    plain = SimpleNamespace(**{**vars(args), "deepspeed_config_dict": None, "zero_stage": 1, "fp16": True,
                               "bf16": False, "global_batch_size": None, "activations_checkpoint_method": None})
    setup = TrainingSetup.from_args(plain)
    assert (setup.precision, setup.zero_stage, setup.num_micro_batches, setup.checkpoint_method,
            setup.reduce_bucket_size, setup.overlap_comm, setup.grad_accum_dtype, setup.fused_adam,
            setup.sub_group_size, setup.param_persistence_threshold) == (
        "fp16", 1, 1, "uniform", 500_000_000, False, None, False, 1_000_000_000, 100_000)
    zero3 = SimpleNamespace(**{**vars(plain), "deepspeed_config_dict": {"zero_optimization": {"stage": 3}},
                               "zero_stage": None})
    assert TrainingSetup.from_args(zero3).overlap_comm is True  # DeepSpeed's default at stage 3
    # Megatron's --sequence-parallel, DeepSpeed-Ulysses' SP size and the fp32 accumulation flag (the
    # ds_config key it sets, when the ds_config does not name one)
    long = SimpleNamespace(**{**vars(plain), "sequence_parallel": True, "ds_sequence_parallel_size": 2,
                              "accumulate_allreduce_grads_in_fp32": True})
    setup = TrainingSetup.from_args(long)
    assert (setup.sequence_parallel, setup.sequence_parallel_size, setup.grad_accum_dtype) == (True, 2, "fp32")


@pytest.mark.parametrize("kw,wrapper", [
    (dict(), "torch"), (dict(zero_stage=1), "zero"), (dict(zero_stage=2, precision="bf16"), "zero"),
    (dict(zero_stage=3), "zero3"), (dict(precision="bf16"), "bf16"),
    (dict(precision="bf16", pipeline=False), "fp16_unfused"), (dict(precision="fp16"), "fp16_unfused"),
    (dict(precision="fp16", fused_adam=True), "fp16_fused"),
    # fp32 accumulation of bf16 gradients: DeepSpeed 0.19.8 builds its BF16_Optimizer at stage 1 only
    (dict(zero_stage=1, precision="bf16", grad_accum_dtype="fp32"), "bf16"),
    (dict(zero_stage=2, precision="bf16", grad_accum_dtype="fp32"), "zero"),
    (dict(zero_stage=1, precision="fp16", grad_accum_dtype="fp32"), "zero"),
    (dict(zero_stage=1, precision="bf16", grad_accum_dtype="bf16"), "zero"),
])
def test_which_optimizer_deepspeed_builds(kw, wrapper):
    assert TrainingSetup(**kw).optimizer_wrapper() == wrapper


# a 6-element matrix, a 3-element bias, a 4-element matrix without a gradient (the last stage's copy
# of the position table)
PARAMS = [HeldParameter(6, True, True), HeldParameter(3, False, True), HeldParameter(4, True, False)]


def test_fp32_torch_optimizer_bytes():
    # DP 1, dense: only parameters with a gradient have one and Adam state (2 x 4 bytes + a 4-byte step)
    assert model_state_bytes(PARAMS, TrainingSetup()) == (13 * 4, 9 * 4, (6 + 3) * 8 + 2 * 4, 0)
    # DP 2: DeepSpeed's all-reduce gives every parameter a gradient, through a flat copy
    assert model_state_bytes(PARAMS, TrainingSetup(data_parallel_size=2)) == (52, 52, 13 * 8 + 3 * 4, 52)
    # SGD: one fp32 momentum buffer per parameter, none without momentum
    assert model_state_bytes(PARAMS, TrainingSetup(optimizer="sgd"))[2] == 9 * 4
    assert model_state_bytes(PARAMS, TrainingSetup(optimizer="sgd", sgd_momentum=0.0))[2] == 0
    # FusedAdam keeps the step in the param group: no per-tensor step
    assert model_state_bytes(PARAMS, TrainingSetup(fused_adam=True))[2] == 9 * 8


def test_fp16_wrappers_bytes():
    # unfused: an fp32 copy of every parameter, each with Adam state; fp32 copies transient in step()
    assert model_state_bytes(PARAMS, TrainingSetup(precision="fp16")) == (
        13 * 2, 9 * 2, 13 * 4 + 13 * 8 + 3 * 4, 13 * 4)
    # fused: flat fp32 copy per param group (matrices 10, vectors 3), Adam state per group, no step
    assert model_state_bytes(PARAMS, TrainingSetup(precision="fp16", fused_adam=True)) == (
        13 * 2, 9 * 2, 13 * 4 + (10 + 3) * 8, 13 * 4)


def test_bf16_and_zero_flat_partitions_bytes():
    # groups flattened and padded to a multiple of 2 x DP: matrices 10 -> 12, vectors 3 -> 4 at DP 2
    # BF16_Optimizer (DP 2): flat bf16 weights, per group an fp32 slice + Adam state + step, a full
    # flat gradient accumulator per group (bf16) plus the .grad tensors
    bf16 = model_state_bytes(PARAMS, TrainingSetup(precision="bf16", data_parallel_size=2))
    assert bf16 == ((12 + 4) * 2, (12 + 4) * 2 + 9 * 2, (6 + 2) * 12 + 2 * 4, 0)
    # ZeRO 1, DP 2, rank 0: slices [0, 6) of the matrices and [0, 2) of the vectors: the 6-element
    # matrix and the bias; rank 1: [6, 12) holds the 4-element matrix without a gradient (a zeros_like)
    z0 = model_state_bytes(PARAMS, TrainingSetup(zero_stage=1, data_parallel_size=2, reduce_bucket_size=10))
    z1 = model_state_bytes(PARAMS, TrainingSetup(zero_stage=1, data_parallel_size=2, reduce_bucket_size=10),
                           dp_rank=1)
    assert z0 == (16 * 4, (6 + 3) * 4, (6 + 2) * 4 + (6 + 2) * 8 + 2 * 4, 10 * 4 + 9 * 4)
    assert z1 == (16 * 4, (4 + 4 + 3) * 4, z0[2], 10 * 4 + 9 * 4)
    # ZeRO 2 with overlap_comm: two buckets, no unreduced full gradient
    z2 = model_state_bytes(PARAMS, TrainingSetup(zero_stage=2, data_parallel_size=2, reduce_bucket_size=10,
                                                 overlap_comm=True))
    assert z2[3] == 2 * 10 * 4
    # an fp32 grad_accum_dtype makes BF16_Optimizer's accumulator fp32
    acc = model_state_bytes(PARAMS, TrainingSetup(precision="bf16", grad_accum_dtype="fp32"))
    assert acc[1] == (10 + 4) * 4 + 9 * 2  # DP 1: groups padded to multiples of 2


def test_zero3_partitions_persistence_and_sub_groups():
    big, small = HeldParameter(200_001, True, True), HeldParameter(10, False, True)
    setup = TrainingSetup(zero_stage=3, data_parallel_size=4, reduce_bucket_size=7)
    part = 50_001 + 3  # ceil(200001 / 4) + ceil(10 / 4)
    # the small one also whole; fp32 master + Adam's moments of the partitions, a step per param
    # group (matrices, vectors: one sub group each)
    assert model_state_bytes([big, small], setup) == ((part + 10) * 4, part * 4, part * 12 + 2 * 4, 7 * 4)
    # DP 1: nothing is gathered, the small parameter is a view of its partition
    one = TrainingSetup(zero_stage=3, reduce_bucket_size=7)
    assert model_state_bytes([big, small], one)[0] == (200_001 + 10) * 4
    # sub groups of 30,000 elements: whole partitions, a group closed once it reaches the size:
    # halves at DP 2 of 40,000 | 10,000 + 25,000 | 5,000 -> three sub groups, three steps
    matrices = [HeldParameter(n, True, True) for n in (80_000, 20_000, 50_000, 10_000)]
    sub = TrainingSetup(zero_stage=3, data_parallel_size=2, sub_group_size=30_000)
    assert model_state_bytes(matrices, sub)[2] == 80_000 * 12 + 3 * 4
    # exactly the size closes a sub group too (DeepSpeed's >=): 30,000 | 40,000 | 5,000 -> three
    # (closing only above it would give 70,000 | 5,000)
    exact = [HeldParameter(n, True, True) for n in (60_000, 80_000, 10_000)]
    assert model_state_bytes(exact, sub)[2] == 75_000 * 12 + 3 * 4
    # a sub_group_size not below the group's size: one sub group
    assert model_state_bytes(exact, TrainingSetup(zero_stage=3, data_parallel_size=2,
                                                  sub_group_size=75_000))[2] == 75_000 * 12 + 4
    # DP 2 gathers: the small parameter whole besides its half
    two = TrainingSetup(zero_stage=3, data_parallel_size=2)
    assert model_state_bytes([big, small], two)[0] == (100_001 + 5 + 10) * 4
    # small parameters in both param groups: halves 3 + 2, both whole as well (6 + 3)
    assert model_state_bytes([HeldParameter(6, True, True), HeldParameter(3, False, True)], two)[0] == (5 + 9) * 4


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
                                    (2 ** 20 - 1, "1024.00 KiB"), (2 ** 20, "1.00 MiB"), (5 * 2 ** 30, "5.00 GiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


# --- activations (the estimate's own rules), the tiny GPT-2: 2 layers, h 64, 4 heads, seq 32,
# vocab 600 padded to 640, ffn 256, fp32, micro batch 1 ---------------------------------------
def tiny(**kw):
    return ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600, **kw)


S, H, F, HEADS, V = 32, 64, 256, 4, 640
LAYER = 4 * S * (4 * H + 4 * H + 2 * F) + 4 * 4 * S + 4 * HEADS * S  # sdpa, no dropout: 132,096
EMBEDDING = 8 * S + 8 * S
HEAD = 2 * 4 * S * H + 2 * 4 * S + 4 * S * V + S * 9 + 4 * S + 4


def test_math_attention_and_dropout_activations():
    setup = TrainingSetup(attention_impl="math", attention_dropout=0.1, hidden_dropout=0.1)
    # the fp32 softmax, its dropout output (4 bytes) and 1-byte mask per score; the context's
    # contiguous copy; two bool residual-dropout masks
    expected = LAYER - 4 * HEADS * S + HEADS * S * S * (4 + 4 + 1) + 4 * S * H + 2 * S * H
    assert layer_activation_bytes(tiny(), setup, 1) == expected == 180_736
    # math without dropout in fp32: the softmax only (no copy in the activation dtype)
    plain = TrainingSetup(attention_impl="math")
    assert layer_activation_bytes(tiny(), plain, 1) == LAYER - 4 * HEADS * S + HEADS * S * S * 4 + 4 * S * H
    assert type(layer_activation_bytes(tiny(tensor_model_parallel_size=2), plain, 1)) is int  # table prints ints


def test_checkpointed_and_pipelined_activations():
    chunk = 4 * S * H  # a checkpointed chunk's saved input
    # uniform, one layer per chunk: two chunk inputs + embedding + head; in backward the head is
    # freed and one layer is recomputed (its saved input not counted twice)
    per_mb = 2 * chunk + EMBEDDING + HEAD
    uniform = TrainingSetup(checkpoint_activations=True)
    assert activation_bytes(tiny(), uniform, 0) == (per_mb - HEAD + LAYER - chunk, per_mb, 1)
    # block, 1 layer: the first layer's input, the second layer whole
    block = TrainingSetup(checkpoint_activations=True, checkpoint_method="block")
    per_mb = chunk + LAYER + EMBEDDING + HEAD
    assert activation_bytes(tiny(), block, 0) == (per_mb, per_mb, 1)
    # PP 2, 4 micro-batches under 1F1B: stage 0 keeps 2 in flight, the last stage 1
    setup = TrainingSetup(num_micro_batches=4)
    shape = tiny(pipeline_model_parallel_size=2)
    assert activation_bytes(shape, setup, 0) == (2 * (LAYER + EMBEDDING), LAYER + EMBEDDING, 2)
    assert activation_bytes(shape, setup, 1) == (LAYER + HEAD, LAYER + HEAD, 1)
    # --no-pipeline-parallel: one micro-batch at a time
    assert activation_bytes(tiny(), TrainingSetup(num_micro_batches=4, pipeline=False), 0)[2] == 1


def test_last_stage_holds_the_tied_copy_first():
    last = held_parameters(tiny(pipeline_model_parallel_size=2), 1)
    # DeepSpeed registers tied modules first; the copy of the position table never gets a gradient
    assert last[:2] == [HeldParameter(V * H, True, True), HeldParameter(S * H, True, False)]
    assert sum(p.numel for p in last) == V * H + S * H + 49_984 + 2 * H  # + layer 2 + final norm
    assert [p.has_grad for p in held_parameters(tiny(pipeline_model_parallel_size=2), 0)] == [True] * 14


def test_embedding_activations_at_tp2_with_dropout():
    """PP 2 stage 0 (embedding and layer 1) at TP 2 with hidden dropout: the layer's column-parallel
    outputs halve, and the embedding adds the out-of-slice mask (1 byte a token) and the bool mask
    of its own dropout (s x h)."""
    setup = TrainingSetup(hidden_dropout=0.1)
    layer = (4 * S * (4 * H + 4 * H // 2 + 2 * F // 2) + 4 * 4 * S + 4 * (HEADS // 2) * S
             + 2 * S * H)  # + the two residual dropouts' bool masks
    embedding = 8 * S + 8 * S + S + S * H
    shape = tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert activation_bytes(shape, setup, 0) == (layer + embedding, layer + embedding, 1)


def test_untied_output_layer_comes_last_at_pp1():
    """Without a tied copy nothing is registered first: the untied output weight is the last
    parameter, after the final norm (the order ZeRO's flat partitions follow)."""
    held = held_parameters(tiny(untie_embeddings_and_output_weights=True), 0)
    assert held[0] == HeldParameter(V * H, True, True) and held[1] == HeldParameter(S * H, True, True)
    assert held[-3:] == [HeldParameter(H, False, True), HeldParameter(H, False, True), HeldParameter(V * H, True, True)]


def test_zero3_persistence_threshold_is_inclusive():
    # DeepSpeed keeps a parameter whole when ds_numel <= stage3_param_persistence_threshold (1e5)
    setup = TrainingSetup(zero_stage=3, data_parallel_size=4, reduce_bucket_size=0)
    at, above = HeldParameter(100_000, True, True), HeldParameter(100_001, True, True)
    assert model_state_bytes([at], setup)[0] == (25_000 + 100_000) * 4
    assert model_state_bytes([above], setup)[0] == 25_001 * 4  # ceil(100,001 / 4)
    # the ds_config's threshold
    lower = TrainingSetup(zero_stage=3, data_parallel_size=4, param_persistence_threshold=99_999)
    assert model_state_bytes([at], lower)[0] == 25_000 * 4


def test_checkpointed_stage_of_one_layer_with_micro_batches_in_flight():
    """PP 2, 4 micro-batches of 2 sequences: stage 0 holds the embedding and layer 1, two
    micro-batches in flight. Checkpointed, a micro-batch keeps the layer's input (4 s b h bytes);
    the backward of the newest one recomputes the layer: its activations replace the saved input,
    which peaks above the kept input. Both methods give the same with one layer."""
    layer, chunk, embedding = 2 * LAYER, 4 * S * 2 * H, 8 * 2 * S + 8 * S  # linear in b, but the position ids
    shape = tiny(pipeline_model_parallel_size=2)
    for method in ("uniform", "block"):
        setup = TrainingSetup(micro_batch_size=2, num_micro_batches=4, checkpoint_activations=True,
                              checkpoint_method=method)
        kept = chunk + embedding
        assert activation_bytes(shape, setup, 0) == (kept + embedding + layer, kept, 2), method


def test_uniform_chunks_of_two_layers():
    """PP 1, chunks of 2 layers: one chunk input kept; in backward the head is freed and the chunk's
    two layers recomputed, their activations replacing its input."""
    setup = TrainingSetup(checkpoint_activations=True, checkpoint_num_layers=2)
    per_mb = 4 * S * H + EMBEDDING + HEAD
    assert activation_bytes(tiny(), setup, 0) == (EMBEDDING + 2 * LAYER, per_mb, 1)
    assert EMBEDDING + 2 * LAYER > per_mb


def test_bf16_softmax_dtype_and_fp32_residual_activations_by_hand():
    """bf16 (2-byte activations) on the tiny shape, one sequence. A layer without the attention core:
    2 x 32 x (4 x 64 + 4 x 64 + 2 x 256) + 16 x 32 = 66,048 bytes; the math core adds 4 x 32 x 32
    scores per kind of saved tensor and a 2 x 32 x 64 = 4,096-byte contiguous context."""
    base, scores, context = 66_048, 4 * 32 * 32, 4_096
    softmax = dict(precision="bf16", attention_impl="math")
    # --no-query-key-layer-scaling: the softmax output in bf16 (2), with dropout also its bf16
    # output (2) and the 1-byte mask
    bf16_softmax = TrainingSetup(**softmax, softmax_in_fp32=False)
    assert layer_activation_bytes(tiny(), bf16_softmax, 1) == base + scores * 2 + context == 78_336
    dropped = TrainingSetup(**softmax, softmax_in_fp32=False, attention_dropout=0.1)
    assert layer_activation_bytes(tiny(), dropped, 1) == base + scores * (2 + 2 + 1) + context == 90_624
    # the fp32 softmax (4) and its bf16 copy (2)
    fp32_softmax = TrainingSetup(**softmax, softmax_in_fp32=True)
    assert layer_activation_bytes(tiny(), fp32_softmax, 1) == base + scores * (4 + 2) + context == 94_720
    # --fp32-residual-connection at TP 2 with --sequence-parallel: per rank 2 x 32 x (128 + 128 + 256)
    # + 16 x 32 / 2 = 33,024, sdpa's logsumexp 4 x 2 heads x 32 = 256; the two norms' inputs are fp32,
    # 2 extra bytes x 2 norms x 32 x 64 / 2 sequence shards = 4,096 more
    tp2 = tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    sp = dict(precision="bf16", sequence_parallel=True)
    assert layer_activation_bytes(tp2, TrainingSetup(**sp), 1) == 33_024 + 256 == 33_280
    residual = TrainingSetup(**sp, fp32_residual_connection=True)
    assert layer_activation_bytes(tp2, residual, 1) == 33_280 + 4_096 == 37_376
    assert type(layer_activation_bytes(tp2, residual, 1)) is int  # the table prints whole bytes
    # the last stage's head: the final norm's input (bf16: 2, fp32 residual: 4) and output (2) and
    # its fp32 statistics per sequence shard, ((2 + 2) x 32 x 64 + 8 x 32) / 2 = 4,224; the fp32
    # softmax over this rank's half of the vocab padded to 768 (a multiple of 128 x TP),
    # 4 x 32 x 384 = 49,152; outside mask and local ids 9 x 32, loss mask 4 x 32 and the count 4
    head = 4_224 + 49_152 + 9 * 32 + 4 * 32 + 4
    assert activation_bytes(tp2, TrainingSetup(**sp), 1)[1] == 33_280 + head
    assert activation_bytes(tp2, residual, 1)[1] == 37_376 + head + 2 * 32 * 64 // 2


def test_setup_reads_the_residual_and_softmax_flags():
    args = SimpleNamespace(deepspeed_config_dict=None, zero_stage=0, fp16=False, bf16=True, global_batch_size=None,
                           micro_batch_size=1, data_parallel_size=1, no_pipeline_parallel=False, optimizer="adam",
                           sgd_momentum=0.9, checkpoint_activations=False, checkpoint_num_layers=1,
                           attention_impl="math", hidden_dropout=0.0, attention_dropout=0.0,
                           model_shape=SimpleNamespace(is_moe=False), fp32_residual_connection=True,
                           apply_query_key_layer_scaling=False, attention_softmax_in_fp32=False)
    setup = TrainingSetup.from_args(args)
    assert (setup.fp32_residual_connection, setup.softmax_in_fp32) == (True, False)
    # Megatron-DeepSpeed's default: query-key layer scaling on, hence an fp32 softmax
    defaults = SimpleNamespace(**{k: v for k, v in vars(args).items()
                                  if k not in ("fp32_residual_connection", "apply_query_key_layer_scaling",
                                               "attention_softmax_in_fp32")})
    setup = TrainingSetup.from_args(defaults)
    assert (setup.fp32_residual_connection, setup.softmax_in_fp32) == (False, True)
