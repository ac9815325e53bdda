"""A step whose gradients overflow is skipped by the engine (DeepSpeed's real overflow check, on
the bf16 + ZeRO path that runs on CPU; fp16 needs CUDA): the learning-rate schedule does not
advance, the log line counts the skipped iteration, consumed samples and gigaflos still advance."""
import pytest

from launcher import TINY, launch
from megatron.launch import logged_iterations

ITERS, SKIP_AT, GBS, SEQ = 4, 2, 4, 32


def test_overflow_step_is_skipped_and_the_schedule_waits(tmp_path, monkeypatch):
    args = list(TINY)
    i = args.index("--lr-warmup-iters")
    args[i + 1] = "4"  # in warmup, every applied step changes the learning rate
    args += ["--global-batch-size", GBS, "--train-iters", ITERS, "--bf16", "--zero-stage", 1]
    monkeypatch.setenv("DRIVER_INF_GRAD_AT", str(SKIP_AT))
    proc, results = launch(1, args, str(tmp_path))
    logged = logged_iterations(proc.stdout)
    assert sorted(logged) == list(range(1, ITERS + 1))
    assert [logged[it]["number of skipped iterations"] for it in range(1, ITERS + 1)] == [0, 1, 0, 0]
    # --lr 3e-3 with 4 warmup iterations = 16 samples: after n applied steps the LR is 3e-3 * 4n / 16
    applied = [1, 1, 2, 3]  # iteration 2 was skipped
    assert [logged[it]["learning rate"] for it in range(1, ITERS + 1)] == \
        pytest.approx([float(f"{3e-3 * GBS * n / 16:.3E}") for n in applied], rel=0, abs=0)
    assert [logged[it]["consumed samples"] for it in range(1, ITERS + 1)] == [GBS * it for it in range(1, ITERS + 1)]
    gigaflos = 6 * ITERS * GBS * SEQ * results[0]["parameters_no_embedding"] / 1e9
    assert results[0]["gigaflos_no_embeds"] == pytest.approx(gigaflos, rel=1e-12)
    assert "loss scale" not in logged[1]  # bf16 scales nothing
