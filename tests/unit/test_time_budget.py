"""--exit-duration-in-mins (megatron/training/time_budget.py): the decision rule on times worked out
by hand, and a run in this process whose budget this process's own age has spent before the first
iteration (the budget counts from the start of the process, not of pretrain())."""
import os
import re
import time

from megatron.training.time_budget import TimeBudget, first_save_estimate, out_of_time
from tests.support.launcher import TINY


def test_the_rule_on_hand_made_times():
    # before any save: 1 s plus 2e8 predicted bytes at 100 MB/s
    assert first_save_estimate(200_000_000) == 3.0
    budget = TimeBudget(seconds=60.0, start=1000.0, save_estimate=3.0)
    for seconds in (2.0, 5.0, 3.0):
        budget.iteration_took(seconds)
    assert budget.times(now=1050.0) == (50.0, 5.0, 3.0)  # the longest iteration; the save's estimate
    assert not out_of_time(60.0, 50.0, 5.0, 3.0)  # 58 s: one more iteration and its save fit
    assert not out_of_time(60.0, 52.0, 5.0, 3.0)  # 60 s: just fit
    assert out_of_time(60.0, 52.5, 5.0, 3.0)  # 60.5 s: would not
    budget.save_took(0.5)
    budget.save_took(0.25)  # the last save's time replaces the estimate (and the save before it)
    assert budget.times(now=1052.5) == (52.5, 5.0, 0.25)
    assert not out_of_time(60.0, *budget.times(now=1052.5))  # 57.75 s
    assert out_of_time(60.0, *budget.times(now=1054.875))  # 60.125 s


def _process_start():
    """This process's start as time.time() counts, by hand from /proc (the trainer asks psutil)."""
    with open("/proc/stat") as f:
        booted = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def test_a_budget_the_process_spent_before_training_trains_and_saves_nothing(entry_point, capsys, tmp_path):
    """This process (pytest, which has imported torch and DeepSpeed) is older than the budget before
    the run begins; counted from pretrain()'s start instead, the budget would leave time to train."""
    import pretrain_gpt
    age = time.time() - _process_start()
    ckpt = tmp_path / "ckpt"
    capsys.readouterr()
    _, progress = pretrain_gpt.main([str(f) for f in TINY + ["--train-iters", 5, "--save", ckpt,
                                                             "--exit-duration-in-mins", age / 60]])
    out = capsys.readouterr().out
    assert progress.iteration == 0
    [line] = [line for line in out.splitlines() if line.startswith("--exit-duration-in-mins: ")]
    match = re.fullmatch(r"--exit-duration-in-mins: ([\d.]+) s used of ([\d.]+) s; one more iteration \(0\.000 s, "
                         r"the longest so far\) and a save \(([\d.]+) s, the first save, estimated\) would not fit: "
                         r"stopping after iteration 0", line)
    assert match, line
    assert float(match.group(1)) >= age - 0.001  # printed to the millisecond
    assert "exiting program at iteration 0" in out and "saved checkpoint" not in out
    assert os.listdir(ckpt) == []  # nothing saved, the lock given back
