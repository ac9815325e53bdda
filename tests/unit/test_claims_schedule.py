"""The run's length and the ramp-up's batch sizes, also under a sequence-length curriculum, worked
out by hand (torch-free, in-process)."""
from types import SimpleNamespace

from megatron.schedules.microbatches import NumMicroBatchesCalculator, run_length


def _args(**changes):
    values = dict(train_iters=None, train_samples=None, train_tokens=None, seq_length=32, global_batch_size=4,
                  micro_batch_size=1, data_parallel_size=2, rampup_batch_size=None, curriculum=None)
    values.update(changes)
    return SimpleNamespace(**values)


def test_train_tokens_round_up_to_a_whole_sample_and_a_whole_batch():
    # 400 tokens / 32 per sample = 12.5: the 13th sample is needed; batches of 4: 4 iterations, 16 samples
    assert run_length(_args(train_iters=100, train_tokens=400)) == (4, 16)
    # 384 tokens: exactly 12 samples, 3 iterations; --train-iters 2 stops first
    assert run_length(_args(train_iters=100, train_tokens=384)) == (3, 12)
    assert run_length(_args(train_iters=2, train_tokens=384)) == (2, 8)
    assert run_length(_args(train_samples=10)) == (3, 12)  # 10 samples: a third, partly used batch


def test_rampup_batches_by_hand():
    """--rampup-batch-size 2 2 12 to a global batch 8: (8 - 2) / 2 = 3 increments, one every
    12 / 3 = 4 samples: batch 2 below 4 samples consumed, 4 below 8, 6 below 12, then 8."""
    calculator = NumMicroBatchesCalculator(8, 1, 2, [2, 2, 12])
    sizes, consumed = [], 0
    while consumed < 40:
        sizes.append(calculator.get_current_global_batch_size())
        assert calculator.get() == sizes[-1] // 2  # micro-batches per rank: batch / (micro 1 x DP 2)
        consumed += sizes[-1]
        calculator.update(consumed)
    # consumed before each step: 0, 2 (batch 2), 4, 8 (4, then 6 at 8), 14 (past 12: 8) ...
    assert sizes == [2, 2, 4, 6, 8, 8, 8, 8]
    args = _args(global_batch_size=8, rampup_batch_size=[2, 2, 12], train_samples=40)
    assert run_length(args) == (8, sum(sizes))


def test_train_tokens_while_a_curriculum_warms_up():
    """The run trains until --train-tokens are consumed at the lengths it trains: 8 + 24 x i / 6
    tokens at iteration i (down to a multiple of 8) is 8, 16, 16, 24, 24, then 32 for good."""
    from megatron.schedules.curriculum import CurriculumSchedule
    linear = CurriculumSchedule(8, 32, "fixed_linear", total_curriculum_step=6, difficulty_step=8)
    assert linear.steady_from() == 6
    # batches of 4: 32, 96, 160, 256, 352, 480 tokens after iterations 1-6, then 128 more each
    args = _args(train_iters=100, train_tokens=384, curriculum=linear)
    assert run_length(args) == (6, 24)  # without the curriculum: 3 iterations, 12 samples
    assert run_length(_args(train_iters=100, train_tokens=481, curriculum=linear)) == (7, 28)
    # 1000 tokens: 480 + 4 x 128 = 992 is short, the 11th iteration reaches 1120
    assert run_length(_args(train_iters=100, train_tokens=1000, curriculum=linear)) == (11, 44)
    assert run_length(_args(train_iters=4, train_tokens=1000, curriculum=linear)) == (4, 16)
    # ramp-up too (2 2 8 to 4, batches 2, 2, 2, 2, 4, ...): 16, 48, 80, 128, 224, 352, 480, 608 tokens
    args = _args(global_batch_size=4, rampup_batch_size=[2, 2, 8], train_samples=1000, train_tokens=600,
                 data_parallel_size=1, curriculum=linear)
    assert run_length(args) == (8, 24)


def test_a_curriculum_settles_where_its_length_stops_changing():
    from megatron.schedules.curriculum import CurriculumSchedule
    # 5 + 995 x i / 10 down to a multiple of 16, capped at 1000: 992 at i = 10 (1000 - 1000 % 16), and
    # 1000 only from i = 11 (1094 -> 1088 -> capped)
    uneven = CurriculumSchedule(5, 1000, "fixed_linear", total_curriculum_step=10, difficulty_step=16)
    assert [uneven.seqlen(i) for i in (9, 10, 11)] == [896, 992, 1000] and uneven.steady_from() == 11
    # fixed_discrete: its last difficulty after its last max_step, or held once it reached the max
    discrete = CurriculumSchedule(64, 512, "fixed_discrete", difficulty=(64, 128, 256), max_step=(10, 40))
    assert discrete.steady_from() == 41
    held = CurriculumSchedule(64, 512, "fixed_discrete", difficulty=(64, 512, 256), max_step=(10, 40))
    assert held.steady_from() == 11 and held.seqlen(41) == 512
    assert CurriculumSchedule(256, 256, "fixed_linear", total_curriculum_step=5).steady_from() == 1
