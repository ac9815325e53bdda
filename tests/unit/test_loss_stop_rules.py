"""--check-for-spiky-loss's rule on hand-made loss sequences (megatron/training/loss_check.py:
Megatron-LM's: the largest |loss| of the run's first 100 finite losses is the reference, every
later loss at least 10 times it is spiky), the reference carried in a checkpoint's progress, and
what a loss check's stop does to a --save directory's files (megatron/checkpoint/writer.py
untrack). Every threshold below is worked out by hand."""
import math
import os

from megatron.checkpoint.writer import untrack
from megatron.schedules.progress import TrainingProgress
from megatron.training.loss_check import is_spiky


def verdicts(losses, **kw):
    progress = TrainingProgress()
    return [is_spiky(progress, loss, **kw) for loss in losses], progress


def test_megatron_lm_defaults_100_samples_and_a_factor_of_10():
    # 100 losses of which the largest is 7.5 (the 50th): the reference; threshold 75
    first = [2.0] * 49 + [7.5] + [3.0] * 50
    decided, progress = verdicts(first + [74.99, 75.0, -75.0, 10.0, 1000.0])
    assert decided == [False] * 100 + [False, True, True, False, True]
    assert (progress.spiky_loss_samples, progress.spiky_loss_max) == (100, 7.5)


def test_the_100th_loss_is_still_a_sample_however_large():
    decided, progress = verdicts([1.0] * 99 + [50.0, 499.0, 500.0])
    assert decided == [False] * 100 + [False, True]  # reference 50, threshold 500
    assert progress.spiky_loss_max == 50.0


def test_the_reference_stops_growing_after_its_samples():
    # samples 3: reference max(|-4|, 2, 3) = 4, threshold 40; later losses (30, 35) never raise it
    decided, progress = verdicts([-4.0, 2.0, 3.0, 30.0, 35.0, 39.9, 40.0], samples=3)
    assert decided == [False, False, False, False, False, False, True]
    assert (progress.spiky_loss_samples, progress.spiky_loss_max) == (3, 4.0)


def test_nan_and_inf_are_neither_samples_nor_spikes():
    # the NaN check's business: they do not count towards the 2 samples, nor against the threshold
    decided, progress = verdicts([math.nan, 1.5, math.inf, -math.inf, 2.0, math.nan, 19.9, 20.0], samples=2)
    assert decided == [False] * 7 + [True]
    assert (progress.spiky_loss_samples, progress.spiky_loss_max) == (2, 2.0)


def test_a_resumed_run_goes_on_with_the_saved_reference():
    # the reference rides in the progress a checkpoint carries: a run loaded after the 2 samples
    # checks its very first loss against them (reference 6, threshold 60)
    _, saved = verdicts([6.0, 5.0], samples=2)
    resumed = TrainingProgress()
    resumed.load_state_dict(saved.state_dict())
    assert [is_spiky(resumed, loss, samples=2) for loss in (59.0, 60.0)] == [False, True]
    older = TrainingProgress()  # a checkpoint written before the check existed: sampling starts over
    older.load_state_dict({k: v for k, v in saved.state_dict().items() if not k.startswith("spiky_loss")})
    assert [is_spiky(older, loss, samples=2) for loss in (59.0, 60.0, 599.0, 600.0)] == [False, False, False, True]


def _save_dir(tmp_path, iterations, tracked):
    for n in iterations:
        (tmp_path / f"global_step{n}").mkdir()
        (tmp_path / f"global_step{n}" / "weights").write_text(str(n))
    (tmp_path / "latest").write_text(f"global_step{tracked}")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(tracked))


def test_untrack_renames_the_suspects_and_points_the_trackers_back(tmp_path):
    _save_dir(tmp_path, [1, 2, 3, 4], tracked=4)
    (tmp_path / "global_step3.suspect").mkdir()  # an earlier stop's, at the same iteration: kept as it is
    assert untrack(str(tmp_path), [3, 4], keep=2) == ["global_step3.suspect2", "global_step4.suspect"]
    assert sorted(os.listdir(tmp_path)) == ["global_step1", "global_step2", "global_step3.suspect",
                                            "global_step3.suspect2", "global_step4.suspect", "latest",
                                            "latest_checkpointed_iteration.txt"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (tmp_path / "latest").read_text() == "global_step2"
    assert (tmp_path / "global_step3.suspect2" / "weights").read_text() == "3"  # whole, only renamed


def test_untrack_without_an_earlier_checkpoint_removes_the_trackers(tmp_path):
    _save_dir(tmp_path, [1], tracked=1)
    assert untrack(str(tmp_path), [1], keep=None) == ["global_step1.suspect"]
    assert sorted(os.listdir(tmp_path)) == ["global_step1.suspect"]
