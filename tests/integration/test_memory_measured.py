"""Memory per rank: the prediction from the config (megatron/metrics/memory.py) equals, byte for byte,
what real DeepSpeed engines built by Trainer.setup_model_and_optimizer hold after their first
iteration (weights, gradients at the optimizer step, optimizer state), on real gloo ranks;
activations (an estimate) are within 5% of the bytes autograd saved for backward (in these
configurations, with and without checkpointing, they agree to the byte; the tolerance leaves room
for kernels that save differently)."""
import pytest

from tests.support.distributed import run_distributed
from tests.support.memory_runs import check_exact, first_iteration

# the TINY trainer config of the launch tests: 2 layers, hidden 64, 4 heads, seq 32, vocab 600 -> 640
H, L, S, V = 64, 2, 32, 640
PER_LAYER = 12 * H * H + 13 * H
TOTAL = V * H + S * H + L * PER_LAYER + 2 * H  # 143,104
PARAM_TENSORS = 2 + 12 * L + 2  # embedding, 12 per layer, final LayerNorm



def test_zero0_fp32_dp2_is_the_plain_adamw_layout():
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4"])[0]
    check_exact(rows)
    # by hand: fp32 weights and gradients, AdamW exp_avg + exp_avg_sq and a 4-byte step per tensor
    for *_, predicted, _ in rows:
        assert (predicted["weights"], predicted["gradients"]) == (4 * TOTAL, 4 * TOTAL)
        assert predicted["optimizer"] == 8 * TOTAL + 4 * PARAM_TENSORS


def test_zero1_dp2_partitions_optimizer_state_with_deepspeed_padding():
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--zero-stage", "1"])[0]
    check_exact(rows)
    # by hand: groups (matrices, then 1-D) of 141,312 and 1,792 elements, both multiples of 2 x DP,
    # so each rank's fp32 slice is half; the weights are the two flat fp32 buffers
    matrices, vectors = V * H + S * H + L * 12 * H * H, L * 13 * H + 2 * H
    for _rank, _, _, _dp, predicted, _ in rows:
        assert predicted["weights"] == 4 * (matrices + vectors)
        assert predicted["optimizer"] == 3 * 4 * (matrices + vectors) // 2 + 2 * 4  # master, m, v; 2 steps
    # rank 0's gradient buffer: the whole parameters that overlap its half of each group
    # (word, position, QKV, dense, h->4h of layer 1 = 75,776; 13h + h of the vectors = 896)
    assert rows[0][4]["gradients"] == 4 * (V * H + S * H + 3 * H * H + H * H + 4 * H * H + 13 * H + H)


def test_zero2_dp2_without_pipeline():
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--zero-stage", "2",
                                                 "--no-pipeline-parallel"])[0]
    check_exact(rows)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_tp2_pp2_exact_state_and_activation_estimate(checkpoint):
    """4 micro-batches: 1F1B keeps 2 in flight on the first stage, 1 on the last; the last stage
    holds the tied embedding copy, whose position table never gets a gradient."""
    flags = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
             "--global-batch-size", "8"] + (["--checkpoint-activations"] if checkpoint else [])
    rows = run_distributed(4, first_iteration, flags, tp=2, pp=2)[0]
    check_exact(rows)
    last = [r for r in rows if r[1] == 1]
    for *_, predicted, _measured in last:
        # the copy's position table: held (weights) but neither gradient nor Adam state
        assert predicted["weights"] - predicted["gradients"] == 4 * S * H
        assert predicted["in_flight"] == 1
    for rank, stage, _, _, predicted, measured in rows:
        assert predicted["in_flight"] == (2 if stage == 0 else 1)
        ratio = measured["activations"] / predicted["activations"]
        assert 0.95 <= ratio <= 1.05, f"rank {rank} activations: estimate {predicted['activations']:,}, " \
                                    f"saved for backward {measured['activations']:,}"


def test_bf16_dp2_through_the_pipeline_engine_is_bf16_optimizer():
    """DeepSpeed wraps bf16 + pipeline engine + ZeRO 0 in BF16_Optimizer (it runs on CPU): bf16 flat
    weights padded to 2 x DP, a full flat bf16 gradient accumulator next to the bf16 .grad tensors
    at the step, fp32 master slices and Adam state per DP rank."""
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--bf16"])[0]
    check_exact(rows)
    for *_, predicted, _ in rows:
        assert predicted["weights"] == 2 * TOTAL  # both groups are multiples of 4 already
        assert predicted["gradients"] == 2 * TOTAL + 2 * TOTAL
        assert predicted["optimizer"] == 3 * 4 * TOTAL // 2 + 2 * 4


@pytest.mark.parametrize("flags", [
    ["--no-pipeline-parallel"],                        # bf16 without the pipeline engine, ZeRO 0
    ["--zero-stage", "1"],                             # bf16 ZeRO 1 through the pipeline engine
    ["--zero-stage", "2", "--no-pipeline-parallel"],   # bf16 ZeRO 2 (the pipeline engine refuses it)
], ids=["zero0-no-pipeline", "zero1-pipeline", "zero2-no-pipeline"])
def test_bf16_optimizer_branches_are_exact(flags):
    """Every other bf16 branch DeepSpeed takes on CPU, measured on its real engine after one
    iteration, and the same numbers by hand."""
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--bf16"] + flags)[0]
    check_exact(rows)
    for rank, _, _, _, predicted, _ in rows:
        assert predicted["weights"] == 2 * TOTAL  # bf16 weights
        if "--zero-stage" not in flags:
            # bf16 gradients; fp32 master weights, exp_avg and exp_avg_sq of every element, a 4-byte
            # step per tensor: nothing partitioned
            assert predicted["gradients"] == 2 * TOTAL
            assert predicted["optimizer"] == 3 * 4 * TOTAL + 4 * PARAM_TENSORS
            continue
        # ZeRO 1 / 2: fp32 master, m and v of this rank's half of the two groups (matrices, then
        # 1-D), one step per group; bf16 gradients of the whole tensors overlapping that half:
        # rank 0 word, position, layer 1's QKV, dense, h->4h and 13h + h of the vectors; rank 1
        # layer 1's h->4h and 4h->h, all of layer 2's matrices, and 12h + 2h of the vectors
        assert predicted["optimizer"] == 3 * 4 * TOTAL // 2 + 2 * 4
        assert predicted["gradients"] == (2 * (V * H + S * H + 8 * H * H + 14 * H) if rank == 0 else
                                          2 * (20 * H * H + 14 * H)), rank


@pytest.mark.parametrize("flags", [
    ["--zero-stage", "1"],                             # DeepSpeed picks BF16_Optimizer for the fp32 accumulator
    ["--zero-stage", "2", "--no-pipeline-parallel"],   # the ZeRO optimizer accumulates in fp32
], ids=["zero1-pipeline", "zero2-no-pipeline"])
def test_bf16_with_fp32_gradient_accumulation_is_exact(flags):
    """--accumulate-allreduce-grads-in-fp32 (the ds_config's data_types.grad_accum_dtype fp32) on the
    real engines DeepSpeed builds for it, and by hand: at ZeRO 1 DeepSpeed switches to BF16_Optimizer,
    a full flat fp32 accumulator next to the bf16 .grad tensors; at ZeRO 2 its ZeRO optimizer keeps
    one fp32 buffer of the rank's half (both groups are multiples of 4: no padding)."""
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--bf16",
                                                "--accumulate-allreduce-grads-in-fp32"] + flags)[0]
    check_exact(rows)
    for *_, predicted, _ in rows:
        assert predicted["gradients"] == (4 * TOTAL + 2 * TOTAL if "1" in flags else 4 * TOTAL // 2)
        assert predicted["optimizer"] == 3 * 4 * TOTAL // 2 + 2 * 4


def test_zero3_bf16_dp2_sub_groups_and_persistent_parameters_are_exact(tmp_path):
    """ZeRO 3 (DeepSpeedZeroOptimizer_Stage3) at DP 2, with a ds_config that cuts the fp32 state
    into sub groups of 20,000 elements and keeps parameters of up to 4,096 elements gathered, and
    by hand. Every tensor has an even size, so each rank's partition is half of every parameter:
    71,552 elements. Kept gathered besides: the position table (2,048), both dense weights (4,096)
    and every vector (1,792): 12,032 elements. The matrices' halves in model order -- word 20,480
    (a sub group), position 1,024 + layer 1's 6,144 + 2,048 + 8,192 + 8,192 = 25,600 (the second),
    layer 2's 24,576 (the third) -- and the vectors' 896 (the fourth): four fp32 master sub groups
    with Adam's two moments, and a step each."""
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 2, "train_batch_size": 4, "bf16": {"enabled": true}, '
                      '"zero_optimization": {"stage": 3, "sub_group_size": 20000, '
                      '"stage3_param_persistence_threshold": 4096}}')
    rows = run_distributed(2, first_iteration, ["--global-batch-size", "4", "--bf16", "--zero-stage", "3",
                                                "--no-pipeline-parallel", "--deepspeed", "--deepspeed_config",
                                                str(config)])[0]
    check_exact(rows)
    half, gathered = TOTAL // 2, S * H + 2 * H * H + L * 13 * H + 2 * H
    assert (half, gathered) == (71_552, 12_032)
    for *_, predicted, _ in rows:
        assert predicted["weights"] == 2 * (half + gathered)
        assert predicted["gradients"] == 2 * half
        assert predicted["optimizer"] == 3 * 4 * half + 4 * 4


def test_zero3_at_dp1_gathers_nothing():
    """ZeRO 3 on one rank: DeepSpeed does not gather (the parameter is a view of its partition), so
    no parameter has a second copy; the fp32 masters are a clone all the same, and the two param
    groups (matrices, vectors) are a sub group each."""
    rows = run_distributed(1, first_iteration, ["--global-batch-size", "2", "--bf16", "--zero-stage", "3",
                                                "--no-pipeline-parallel"])[0]
    check_exact(rows)
    [(*_, predicted, _)] = rows
    assert (predicted["weights"], predicted["gradients"]) == (2 * TOTAL, 2 * TOTAL)
    assert predicted["optimizer"] == 3 * 4 * TOTAL + 2 * 4
