"""What one checkpoint needs where (megatron/checkpoint/save_dir.py), on rows and ranks made up by
hand: which rank saves what under each optimizer, and which ranks count against which filesystem."""
from megatron.checkpoint.save_dir import filesystem_groups, rank_checkpoint_bytes
from megatron.metrics.memory import RankMemory, TrainingSetup


def _row(dp_rank, weights=1000, optimizer=30):
    return RankMemory(stage=0, dp_rank=dp_rank, weights=weights, gradients=7, optimizer=optimizer, activations=9,
                      activations_per_micro_batch=9, in_flight=1, transient=0)


def test_which_rank_saves_what():
    plain = TrainingSetup(data_parallel_size=2)  # fp32, ZeRO 0: the first DP rank saves it all
    assert [rank_checkpoint_bytes(_row(d), plain) for d in (0, 1)] == [1030, 0]
    zero1 = TrainingSetup(data_parallel_size=2, zero_stage=1)  # each DP rank its optimizer partition
    assert [rank_checkpoint_bytes(_row(d), zero1) for d in (0, 1)] == [1030, 30]
    bf16 = TrainingSetup(data_parallel_size=2, precision="bf16")  # the pipeline's BF16_Optimizer partitions too
    assert [rank_checkpoint_bytes(_row(d), bf16) for d in (0, 1)] == [1030, 30]
    zero3 = TrainingSetup(data_parallel_size=2, zero_stage=3)  # weights only as the optimizer's fp32 copies
    assert [rank_checkpoint_bytes(_row(d), zero3) for d in (0, 1)] == [30, 30]


def test_which_ranks_count_against_which_filesystem():
    # ranks 0, 1 (host a) and 4 (host c) see rank 0's lock: one shared filesystem; host b's ranks
    # 2 and 3 write to a disk of their own, checked by rank 2
    writers = [("a", True, 10), ("a", True, 20), ("b", False, 5), ("b", False, 7), ("c", True, 1)]
    assert filesystem_groups(writers) == {0: 10 + 20 + 1, 2: 5 + 7}
