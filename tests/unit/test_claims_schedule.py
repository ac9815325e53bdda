"""The run's length and the ramp-up's batch sizes, worked out by hand (torch-free, in-process)."""
from types import SimpleNamespace

from megatron.schedules.microbatches import NumMicroBatchesCalculator, run_length


def _args(**changes):
    values = dict(train_iters=None, train_samples=None, train_tokens=None, seq_length=32, global_batch_size=4,
                  micro_batch_size=1, data_parallel_size=2, rampup_batch_size=None)
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
