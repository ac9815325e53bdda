"""The memory table under both kinds of sequence parallelism and with fp32 gradient accumulation,
each value worked out item by item by hand (survivors of the mutation run, benchmarks/mutation.sh;
the multi-rank tests compare the same rules with measured bytes). In-process, torch-free; the tiny
GPT-2: 2 layers, h 64, 4 heads, seq 32, vocab 600 padded to 640, ffn 256, fp32, micro batch 1."""
from megatron.metrics.memory import (
    HeldParameter,
    TrainingSetup,
    activation_bytes,
    format_memory_report,
    layer_activation_bytes,
    model_state_bytes,
)
from megatron.model.shape import ModelShape

S, H, F, V = 32, 64, 256, 640
V_TP2 = 768  # 600 padded to a multiple of 128 x TP = 256


def tiny(**kw):
    return ModelShape(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=600, **kw)


def ints(values):
    """The table prints integers with thousands separators: a float would print '1,234.0'."""
    assert all(type(v) is int for v in values), values
    return values


# Megatron sequence parallelism at TP 2: the LayerNorm items, their fp32 statistics, the residual
# dropout masks and the checkpointed chunk inputs hold s/2 tokens; the TP linears' items are per
# TP rank as without it. One TP rank, fp32, one sequence, sdpa:
LN_SP = 4 * (S // 2) * 4 * H       # two LayerNorms' inputs and outputs, 16 tokens: 16,384
QKV_CTX_TP2 = 4 * S * 4 * H // 2   # QKV (3h/2) + the context (h/2), 32 tokens: 16,384
MLP_TP2 = 4 * S * 2 * F // 2       # h->4h output and GeLU output (f/2 each): 32,768
STATS_SP = 4 * 4 * (S // 2)        # mean and rstd of two LayerNorms, fp32: 256
LSE_TP2 = 4 * 2 * S                # sdpa's logsumexp, 2 heads per TP rank: 256
LAYER_SP = LN_SP + QKV_CTX_TP2 + MLP_TP2 + STATS_SP + LSE_TP2


def test_megatron_sequence_parallel_layer_embedding_and_head():
    sp = TrainingSetup(sequence_parallel=True)
    shape = tiny(tensor_model_parallel_size=2)
    assert LAYER_SP == 66_048
    assert ints([layer_activation_bytes(shape, sp, 1)]) == [LAYER_SP]
    # without it the LayerNorm items hold all 32 tokens: 16,384 + 256 more
    assert layer_activation_bytes(shape, TrainingSetup(), 1) == LAYER_SP + LN_SP + STATS_SP
    # hidden dropout: two bool residual masks of 16 tokens x h
    dropout = TrainingSetup(sequence_parallel=True, hidden_dropout=0.1)
    assert ints([layer_activation_bytes(shape, dropout, 1)]) == [LAYER_SP + 2 * (S // 2) * H]
    # PP 2 at TP 2: stage 0 is the embedding and layer 1. Embedding: token and position ids (8
    # bytes each a token), the out-of-slice mask (1 byte a token), the dropout's bool mask of
    # 16 tokens x h. Stage 1 is layer 2 and the head: the final LayerNorm's input and output and its
    # statistics of 16 tokens; the fp32 softmax of every token over the 384 vocab entries of this
    # TP rank (the vocabulary padded to 768 at TP 2); the outside mask (1 byte) and local ids (8
    # bytes) a token, the loss mask (4 bytes) a token and the 4-byte token count
    pp2 = tiny(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    layer = LAYER_SP + 2 * (S // 2) * H
    embedding = 8 * S + 8 * S + S + (S // 2) * H
    head = 2 * 4 * (S // 2) * H + 2 * 4 * (S // 2) + 4 * S * V_TP2 // 2 + S * (1 + 8) + 4 * S + 4
    assert (embedding, head) == (1_568, 57_892)
    assert ints(activation_bytes(pp2, dropout, 0)) == (layer + embedding, layer + embedding, 1)
    assert ints(activation_bytes(pp2, dropout, 1)) == (layer + head, layer + head, 1)


def test_megatron_sequence_parallel_checkpointed_chunks():
    """PP 1, uniform checkpointing of one layer: each chunk keeps its input of 16 tokens x h; in
    backward the head is freed and one layer recomputed (its input not counted twice)."""
    setup = TrainingSetup(sequence_parallel=True, checkpoint_activations=True)
    chunk = 4 * (S // 2) * H  # 4,096
    embedding = 8 * S + 8 * S + S
    head = 2 * 4 * (S // 2) * H + 2 * 4 * (S // 2) + 4 * S * V_TP2 // 2 + S * 9 + 4 * S + 4
    per_mb = 2 * chunk + embedding + head
    in_backward = 2 * chunk + embedding + LAYER_SP - chunk
    assert ints(activation_bytes(tiny(tensor_model_parallel_size=2), setup, 0)) == (in_backward, per_mb, 1)
    assert (in_backward, per_mb) == (70_688, 66_628)


# DeepSpeed-Ulysses, SP 2 at TP 1: 16 tokens per rank; the attention core sees all 32 positions of
# 4 / 2 heads, whose logsumexp is the same 2 x 32 = 4 x 16 floats; the core keeps its own output
# (16 tokens x h), which the dense layer's input, the all-to-all's result, no longer views.
LAYER_ULYSSES = (4 * 16 * 4 * H      # LayerNorm inputs and outputs: 16,384
                 + 4 * 16 * 4 * H    # QKV + context: 16,384
                 + 4 * 16 * 2 * F    # h->4h + GeLU: 32,768
                 + 4 * 4 * 16        # LayerNorm statistics: 256
                 + 4 * 2 * S         # logsumexp: 256
                 + 4 * 16 * H)       # the core's output before the all-to-all back: 4,096


def test_ulysses_layer_and_checkpointed_chunks():
    setup = TrainingSetup(sequence_parallel_size=2)
    assert LAYER_ULYSSES == 70_144
    assert ints([layer_activation_bytes(tiny(), setup, 1)]) == [LAYER_ULYSSES]
    # the embedding's ids and the head are per this rank's 16 tokens, but the loss mask covers
    # the whole 32-token sequence (the loss is gathered)
    embedding = 8 * 16 + 8 * 16
    head = 2 * 4 * 16 * H + 2 * 4 * 16 + 4 * 16 * V + 16 * 9 + 4 * S + 4
    assert head == 49_556
    checkpointed = TrainingSetup(sequence_parallel_size=2, checkpoint_activations=True)
    chunk = 4 * 16 * H
    per_mb = 2 * chunk + embedding + head
    in_backward = 2 * chunk + embedding + LAYER_ULYSSES - chunk
    assert ints(activation_bytes(tiny(), checkpointed, 0)) == (in_backward, per_mb, 1) == (74_496, 58_004, 1)


def test_zero2_fp32_accumulation_holds_the_partition_in_fp32():
    """bf16 weights, ZeRO 2, DP 2, fp32 accumulation: no whole parameters, one fp32 buffer of the
    rank's slice per group: matrices 6 + 4 = 10 padded to 12 (slice 6), vectors 3 padded to 4
    (slice 2)."""
    params = [HeldParameter(6, True, True), HeldParameter(3, False, True), HeldParameter(4, True, False)]
    setup = TrainingSetup(precision="bf16", zero_stage=2, data_parallel_size=2, grad_accum_dtype="fp32",
                          reduce_bucket_size=10)
    # weights: flat bf16 12 + 4; optimizer: fp32 slices 6 + 2, Adam's two moments and a step per
    # group; transient: one bf16 bucket of 10 (no overlap_comm, no unreduced gradient at stage 2)
    assert model_state_bytes(params, setup) == ((12 + 4) * 2, (6 + 2) * 4, (6 + 2) * 4 + (6 + 2) * 8 + 2 * 4, 10 * 2)
    assert model_state_bytes(params, setup, dp_rank=1)[1] == (6 + 2) * 4


def test_report_header_names_both_kinds_of_sequence_parallelism():
    megatron = format_memory_report(tiny(tensor_model_parallel_size=2), TrainingSetup(sequence_parallel=True))
    assert megatron[0] == ("memory per rank (predicted; fp32, ZeRO 0, torch optimizer, DP=1, micro batch 1 x 1, "
                           "sequence parallel):")
    # Ulysses: the dp rank column counts the DP x SP ranks DeepSpeed partitions ZeRO state over
    ulysses = format_memory_report(tiny(), TrainingSetup(sequence_parallel_size=2, data_parallel_size=2))
    assert ulysses[0] == ("memory per rank (predicted; fp32, ZeRO 0, torch optimizer, DP=2 x SP=2 "
                          "(ZeRO over 4 ranks), micro batch 1 x 1):")
    assert len(ulysses) == 5  # one stage row, the most loaded line, the flat all-reduce copy (DP > 1)
    plain = format_memory_report(tiny(), TrainingSetup())
    assert "SP=" not in plain[0] and "sequence parallel" not in plain[0]
