"""A loss check's stop in real 2-rank launches (TP1 x PP2, --save-interval 1, --check-for-spiky-loss):
the run stops with one line and exit code 3, and the trackers never stay on a checkpoint whose
weights produced the bad loss (megatron/training/loss_check.py, CheckpointManager.untrack_from).

The blow-up comes at a known iteration: right after iteration 3's step every rank multiplies its
weights by 1000 (tests/support/pretrain_driver.py, DRIVER_SCALE_WEIGHTS_AT), before iteration 3 is
saved. Iterations 4-5 are skipped (--skip-train-iteration-range): they train nothing, so their
checkpoints hold the same weights, and iteration 6's loss is the first they produce. The spike
rule's reference is the first 2 losses (DRIVER_SPIKY_SAMPLES; Megatron-LM's 100 would need a
100-iteration run): the expected thresholds are worked out from the losses the ranks recorded.

The resumed run loads what the tracker names and repeats the blow-up without the skipped range:
its iteration 3 is the first run's bit for bit (an uninterrupted run of the same seed up to there),
its check uses the saved reference (no new samples: iteration 4's loss is judged at once), and its
stop keeps the first run's suspect checkpoints."""
import os

import pytest

from megatron.checkpoint.manifest import read_manifest, verify_share
from tests.support.launch import logged_iterations
from tests.support.launcher import TINY, launch

LOSS_STOP_EXIT_CODE = 3  # pretrain_gpt.py's code for a NaN / Inf or spiky-loss stop (docs/long-runs.md)
RUN = TINY + ["--global-batch-size", 4, "--train-iters", 8, "--eval-iters", 0, "--pipeline-model-parallel-size", 2,
              "--save-interval", 1, "--check-for-spiky-loss"]
TRACKERS = ["latest", "latest_checkpointed_iteration.txt"]


def _launch(monkeypatch, out, args):
    monkeypatch.setenv("DRIVER_SCALE_WEIGHTS_AT", "3:1000")
    monkeypatch.setenv("DRIVER_SPIKY_SAMPLES", "2")
    return launch(2, args, str(out), check=False)


def _step_losses(rank_json):
    return {int(it): loss for it, loss in rank_json["step_losses"].items()}


def _stop_line(output):
    [line] = [line for line in output.splitlines() if line.startswith("stopping at iteration")]
    return line


def _tracked(ckpt):
    return (ckpt / "latest_checkpointed_iteration.txt").read_text(), (ckpt / "latest").read_text()


def _whole(step):
    """Every file of a saved iteration as its manifest lists it (one process checks them all)."""
    return verify_share(str(step), read_manifest(str(step)), 0, 1) is None


@pytest.fixture(scope="module")
def spiked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spiked")
    ckpt = tmp / "ckpt"
    monkeypatch = pytest.MonkeyPatch()
    try:
        proc, ranks = _launch(monkeypatch, tmp / "run",
                              RUN + ["--skip-train-iteration-range", "4-5", "--save", ckpt])
    finally:
        monkeypatch.undo()
    return {"proc": proc, "ranks": ranks, "ckpt": ckpt, "tmp": tmp}


def test_a_spike_stops_every_rank_and_the_trackers_go_back_to_the_last_sane_checkpoint(spiked):
    proc, ranks, ckpt = spiked["proc"], spiked["ranks"], spiked["ckpt"]
    assert proc.returncode == LOSS_STOP_EXIT_CODE, proc.stdout[-6000:]
    assert "Traceback" not in proc.stdout
    losses = _step_losses(ranks[1])  # the last stage computes the loss (the first gets it broadcast)
    assert _step_losses(ranks[0]) == losses
    assert sorted(losses) == [1, 2, 3, 6]  # 4-5 skipped; 6 is the first loss of the scaled weights
    reference = max(abs(losses[1]), abs(losses[2]))
    assert abs(losses[3]) < 10 * reference <= abs(losses[6])  # the rule by hand: 3 passes, 6 stops
    assert [ranks[r]["stopped"] for r in (0, 1)] == [LOSS_STOP_EXIT_CODE] * 2
    assert sorted(logged_iterations(proc.stdout)) == [1, 2, 3]  # nothing of iteration 6 is logged

    # the weights of iteration 3's update produced iteration 6's loss: checkpoints 3, 4 and 5 hold them
    assert _stop_line(proc.stdout) == (
        f"stopping at iteration 6: the lm loss ({losses[6]:.6E}) is at least 10 times the largest of the run's "
        f"first 2 ({reference:.6E}, --check-for-spiky-loss); nothing saved at this iteration; --save {ckpt}: "
        "global_step3, global_step4, global_step5 held the weights that produced it, kept untracked as "
        "global_step3.suspect, global_step4.suspect, global_step5.suspect; global_step2 is the tracked "
        "checkpoint. Resume with a lower --lr or skip the data from that update on with "
        "--skip-train-iteration-range 3-6 (without --check-for-spiky-loss it trains on)")
    assert _tracked(ckpt) == ("2", "global_step2")
    # nothing lost: every checkpoint still there, whole; the lock released
    assert sorted(os.listdir(ckpt)) == ["global_step1", "global_step2", "global_step3.suspect",
                                        "global_step4.suspect", "global_step5.suspect", *TRACKERS]
    assert all(_whole(ckpt / name) for name in os.listdir(ckpt) if name.startswith("global_step"))


def test_the_run_resumed_from_the_tracker_continues_exactly_and_keeps_the_reference(spiked, monkeypatch):
    ckpt, first = spiked["ckpt"], _step_losses(spiked["ranks"][1])
    proc, ranks = _launch(monkeypatch, spiked["tmp"] / "resumed", RUN + ["--load", ckpt, "--save", ckpt])
    assert proc.returncode == LOSS_STOP_EXIT_CODE, proc.stdout[-6000:]
    assert f"loaded checkpoint {ckpt}/global_step2/" in proc.stdout
    losses = _step_losses(ranks[1])
    assert sorted(losses) == [3, 4]
    assert losses[3] == first[3]  # bit for bit: iteration 3 as the uninterrupted run of the same seed
    # no new samples after the resume: the saved reference (the first run's first 2 losses) judges iteration 4
    reference = max(abs(first[1]), abs(first[2]))
    assert abs(losses[4]) >= 10 * reference
    line = _stop_line(proc.stdout)
    assert line.startswith(f"stopping at iteration 4: the lm loss ({losses[4]:.6E}) is at least 10 times the "
                           f"largest of the run's first 2 ({reference:.6E}, --check-for-spiky-loss);")
    # the new global_step3 is the suspect now; the first run's is kept beside it under the next free name
    assert (f"--save {ckpt}: global_step3 held the weights that produced it, kept untracked as "
            "global_step3.suspect2; global_step2 is the tracked checkpoint.") in line
    assert _tracked(ckpt) == ("2", "global_step2")
    assert sorted(os.listdir(ckpt)) == ["global_step1", "global_step2", "global_step3.suspect", "global_step3.suspect2",
                                        "global_step4.suspect", "global_step5.suspect", *TRACKERS]
