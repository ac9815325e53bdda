"""A step whose gradients overflow is skipped by the engine (DeepSpeed's real overflow check, on
the bf16 + ZeRO path that runs on CPU; fp16 needs CUDA): the learning-rate schedule does not
advance, the log line counts the skipped iteration, its loss is left out of the interval's mean
lm loss, and consumed samples and gigaflos still advance."""
import pytest

from tests.support.launch import logged_iterations
from tests.support.launcher import TINY, launch

ITERS, SKIP_AT, GBS, SEQ = 4, 2, 4, 32


def test_overflow_step_is_skipped_and_the_schedule_waits(tmp_path, monkeypatch):
    args = list(TINY)
    args[args.index("--lr-warmup-iters") + 1] = "4"  # in warmup, every applied step changes the learning rate
    args[args.index("--log-interval") + 1] = "2"  # iterations 1-2 (2 skipped) and 3-4 in one line each
    args += ["--global-batch-size", GBS, "--train-iters", ITERS, "--bf16", "--zero-stage", 1]
    monkeypatch.setenv("DRIVER_INF_GRAD_AT", str(SKIP_AT))
    proc, results = launch(1, args, str(tmp_path))
    logged = logged_iterations(proc.stdout)
    assert sorted(logged) == [2, 4]
    assert [logged[it]["number of skipped iterations"] for it in (2, 4)] == [1, 0]
    # --lr 3e-3 with 4 warmup iterations = 16 samples: after n applied steps the LR is 3e-3 * 4n / 16
    applied = {2: 1, 4: 3}  # iteration 2 was skipped
    for it in (2, 4):
        assert logged[it]["learning rate"] == float(f"{3e-3 * GBS * applied[it] / 16:.3E}"), it
        assert logged[it]["consumed samples"] == GBS * it
    # the interval mean: iteration 1's loss alone for iterations 1-2 (the skipped step's loss is
    # finite, only its gradients overflowed: counting it would change the mean), then 3 and 4
    own = {int(it): loss for it, loss in results[0]["step_losses"].items()}
    assert sorted(own) == [1, 2, 3, 4] and own[2] != own[1]
    assert logged[2]["lm loss"] == float(f"{own[1]:.6E}")
    assert logged[2]["lm loss"] != float(f"{(own[1] + own[2]) / 2:.6E}")
    assert logged[4]["lm loss"] == pytest.approx(float(f"{(own[3] + own[4]) / 2:.6E}"), rel=1e-6)
    gigaflos = 6 * ITERS * GBS * SEQ * results[0]["parameters_no_embedding"] / 1e9
    assert results[0]["gigaflos_no_embeds"] == pytest.approx(gigaflos, rel=1e-12)
    assert "loss scale" not in logged[2]  # bf16 scales nothing
