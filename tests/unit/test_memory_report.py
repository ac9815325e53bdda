"""The memory table's wiring and wording, by hand (survivors of the mutation run,
benchmarks/mutation.sh): which rank is the most loaded, the rows predict_memory assembles per
(stage, DP rank) at PP 2 with the last stage's tied copy first, the header's notes and the lines
under the table. In-process, torch-free; the tiny GPT-2: 2 layers, h 64, 4 heads, seq 32, vocab
600 padded to 640."""
from types import SimpleNamespace

from megatron.metrics.memory import RankMemory, TrainingSetup, format_memory_report, most_loaded, predict_memory
from megatron.model.shape import ModelShape

H, S, V, F = 64, 32, 640, 256
LAYER_MATRICES = [3 * H * H, H * H, H * F, F * H]                 # QKV, dense, h->4h, 4h->h
LAYER_VECTORS = [H, H, 3 * H, H, H, H, F, H]                       # norms and biases, in module order


def tiny(**kw):
    return ModelShape(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=600, **kw)


def rank(stage, dp_rank, weights, transient=0):
    return RankMemory(stage, dp_rank, weights, 0, 0, 0, 0, 1, transient)


def test_most_loaded_is_the_largest_total_then_transient():
    # not the last stage nor the last DP rank: the largest total
    assert most_loaded([rank(0, 0, 10), rank(1, 0, 5), rank(1, 1, 9)]) == rank(0, 0, 10)
    # equal totals: the larger transient
    assert most_loaded([rank(0, 0, 10, transient=7), rank(1, 1, 10, transient=3)]).transient == 7


def test_pp2_zero1_rows_by_hand():
    """bf16, ZeRO 1, DP 2, PP 2, 4 micro-batches, reduce bucket 10 elements. The last stage holds
    the tied embedding copy (word table 640 x 64, position table 32 x 64 without a gradient) before
    layer 2, so its matrices group is [40960, 2048 | 12288, 4096, 16384, 16384] = 92,160 elements:
    DP rank 0's half [0, 46080) overlaps the two tables and the QKV weight."""
    setup = TrainingSetup(precision="bf16", zero_stage=1, data_parallel_size=2, num_micro_batches=4,
                          reduce_bucket_size=10)
    rows = {(r.stage, r.dp_rank): r for r in predict_memory(tiny(pipeline_model_parallel_size=2), setup)}
    assert sorted(rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    last = rows[1, 0]
    # vectors: layer 2's 832 + the final norm's 128 = 960, half 480: rank 0 holds the first six
    # (64 + 64 + 192 + 64 + 64 + 64 = 512; the last starts at 448), not the h->4h bias starting at 512
    vectors_rank0 = 512
    # bf16 gradients; the position table in the slice without a gradient gets a zeros_like
    assert last.gradients == 2 * (V * H + S * H + S * H + 3 * H * H) + 2 * vectors_rank0
    # transient: the reduce bucket (10 bf16 elements) and ZeRO 1's unreduced full gradient of every
    # parameter with one (all but the position table copy)
    with_grad = V * H + sum(LAYER_MATRICES) + sum(LAYER_VECTORS) + 2 * H
    assert last.transient == 2 * 10 + 2 * with_grad
    # 1F1B: stage 0 holds min(PP - 0, 4) = 2 micro-batches, the last stage 1
    assert (rows[0, 0].in_flight, rows[0, 1].in_flight, last.in_flight) == (2, 2, 1)


def test_header_notes_and_lines_under_the_table():
    shape = tiny()
    plain = format_memory_report(shape, TrainingSetup(micro_batch_size=2, num_micro_batches=3))
    assert plain[0] == "memory per rank (predicted; fp32, ZeRO 0, torch optimizer, DP=1, micro batch 2 x 3):"
    assert plain[1] == ("  stage | dp rank |         weights |       gradients |       optimizer |    activations* |"
                        "           total")
    assert len(plain) == 4  # one stage row, the most loaded line; no transient at fp32 DP 1, dense
    # weights and gradients 4 x 143,104, Adam 8 x 143,104 + 28 steps of 4 bytes, activations of a micro
    # batch of 2: 727,108 (tests/unit/test_breakdowns_by_hand.py's derivation): 3,016,884 bytes = 2.88 MiB;
    # one micro-batch in flight at PP 1: 727,108 / 1024 = 710.07 KiB
    assert plain[3] == ("  most loaded rank (stage 0, DP rank 0): 2.88 MiB; *activations estimated: "
                        "1 micro-batch(es) in flight x 710.07 KiB")
    uniform = format_memory_report(shape, TrainingSetup(checkpoint_activations=True))
    assert uniform[0].endswith("micro batch 1 x 1, checkpointed activations):")
    block = format_memory_report(shape, TrainingSetup(checkpoint_activations=True, checkpoint_method="block",
                                                      checkpoint_num_layers=2))
    assert block[0].endswith("micro batch 1 x 1, checkpointed activations (block: first 2 layer(s) of each stage)):")


def test_moe_notes_and_the_transient_line():
    moe = tiny(num_experts=(4,))
    # fp32, ZeRO 0, DP 1: an MoE model's gradients are reduced anyway, through a flat copy of all of
    # them (transient): 143,104 + 3 more experts (3 x 33,088) + the router 4 x 64 elements, 4 bytes
    flat = 4 * (143_104 + 3 * (H * F + F + F * H + H) + 4 * H)
    lines = format_memory_report(moe, TrainingSetup(moe=True))
    assert lines[-2].endswith(" (MoE layers counted as dense ones: routing and capacity buffers not included)")
    assert flat == 970_496  # 947.75 KiB
    assert lines[-1] == ("  plus up to 947.75 KiB transient during backward / step (reduce buckets, "
                         "unreduced or fp32 gradient copies; not in the total)")
    assert not any(line.startswith("  estimate:") for line in lines)
    zero1 = format_memory_report(moe, TrainingSetup(moe=True, zero_stage=1))
    assert ("  estimate: with ZeRO 1 DeepSpeed partitions the expert parameter groups over the "
            "expert-data-parallel group, which this table does not model") in zero1
    dense = format_memory_report(tiny(), TrainingSetup(zero_stage=1))
    assert not any("MoE" in line or line.startswith("  estimate:") for line in dense)


def test_setup_from_the_trainers_namespace_defaults():
    """A namespace without a ds_config or a checkpoint method (the trainer's own when DeepSpeed's
    config is not read): ZeRO 0, fp32, uniform; the micro-batch count an integer."""
    args = SimpleNamespace(zero_stage=None, fp16=False, bf16=False, global_batch_size=12, micro_batch_size=2,
                           data_parallel_size=2, no_pipeline_parallel=False, optimizer="adam", sgd_momentum=0.9,
                           checkpoint_activations=True, checkpoint_num_layers=1, attention_impl="sdpa",
                           hidden_dropout=0.0, attention_dropout=0.0, model_shape=tiny())
    setup = TrainingSetup.from_args(args)
    assert (setup.zero_stage, setup.precision, setup.checkpoint_method) == (0, "fp32", "uniform")
    assert setup.num_micro_batches == 3 and type(setup.num_micro_batches) is int
    # a ds_config without a ZeRO stage: DeepSpeed's default 0
    staged = TrainingSetup.from_args(SimpleNamespace(**vars(args), deepspeed_config_dict={"zero_optimization": {}}))
    assert staged.zero_stage == 0
