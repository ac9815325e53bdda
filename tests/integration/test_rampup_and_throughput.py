"""Batch-size ramp-up in a real DP=2 run with activation checkpointing: the global batch follows
Megatron's schedule, the number of micro-batches follows it, samples per second times the
iteration time is the number of samples the iteration consumed, the per-replica figure is the
total over the 2 replicas, and TFLOPs follow from the cached FLOPs per sample.
Validation during the ramp-up counts the batches it really evaluated, so a run resumed in the
middle of the ramp-up (from the uninterrupted run's checkpoint of iteration 6) validates on the
same samples as the uninterrupted run."""
import re
import shutil

import pytest

from tests.support.launch import logged_iterations
from tests.support.launcher import TINY, launch

SEQ = 32
RESUME_AT = 6


def validation_losses(output):
    return dict(re.findall(r" validation loss at (iteration \d+|the end of training for val data) \| "
                           r"lm loss value: ([0-9.E+-]+)", output))


def test_rampup_schedule_and_logged_throughput(tmp_path):
    i = TINY.index("--lr-warmup-iters")
    base = TINY[:i] + TINY[i + 2:]  # sample-based run: warmup in samples
    base[base.index("--micro-batch-size") + 1] = "1"  # x DP 2: batches grow in steps of 2 samples
    base[base.index("--eval-interval") + 1] = "2"
    args = base + ["--train-samples", 60, "--global-batch-size", 8, "--rampup-batch-size", 2, 2, 24,
                   "--lr-warmup-samples", 8, "--checkpoint-activations"]
    saved = tmp_path / "saved"
    whole_args = args + ["--tensorboard-dir", tmp_path / "tb", "--log-batch-size-to-tensorboard",
                         "--log-timers-to-tensorboard", "--save", saved, "--save-interval", RESUME_AT]
    proc, results = launch(2, whole_args, str(tmp_path / "run"))
    last = results[1]
    # start 2, +2 every 24/3 = 8 samples until 8: 2,2,2,2 | 4,4 | 6,6 | 8,8,8,8 (60 samples)
    batches = [2, 2, 2, 2, 4, 4, 6, 6, 8, 8, 8, 8]
    assert last["iteration"] == len(batches)
    assert " iteration       12/      12 | consumed samples:           60 |" in proc.stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    assert [scalars["batch-size/batch-size"][i] for i in range(1, 13)] == batches

    flops = last["flops_per_sample"]
    # recompute factor 4: 4 L (8 s h^2 + 4 s^2 h + 4 s h f) + 3 (2 s h V), h=64, f=256, V=640
    assert flops == 4 * 2 * (8 * SEQ * 64 * 64 + 4 * SEQ * SEQ * 64 + 4 * SEQ * 64 * 256) + 6 * SEQ * 64 * 640
    world, dp = 2, 2
    logged = logged_iterations(proc.stdout)
    for it in range(1, 13):
        consumed = logged[it]["consumed samples"] - (logged[it - 1]["consumed samples"] if it > 1 else 0)
        assert consumed == batches[it - 1]
        sps = scalars["iteration-time/samples per second"][it]
        seconds = scalars["iteration-time/iteration-time"][it]  # the one iteration of the log interval
        assert sps * seconds == pytest.approx(consumed, rel=1e-5)
        assert scalars["iteration-time/samples per second per replica"][it] == pytest.approx(consumed / seconds / dp,
                                                                                            rel=1e-5)
        tflops = scalars["iteration-time/TFLOPs per gpu (estimated)"][it]
        assert tflops == pytest.approx(consumed * flops / seconds / world / 1e12, rel=1e-5)
        assert scalars["iteration-time/tokens per second"][it] == pytest.approx(consumed * SEQ / seconds, rel=1e-5)
    # gigaflos accumulate 6 x samples x seq x non-embedding params with the ramping batch
    gigaflos = 6 * sum(batches) * SEQ * last["parameters_no_embedding"] / 1e9
    assert last["gigaflos_no_embeds"] == pytest.approx(gigaflos, rel=1e-12)

    # evaluation after iteration 2k runs one batch of the next iteration's size: 2, 4, 6, 8, 8, 8,
    # and one more at the end of training
    assert last["consumed_valid_samples"] == 2 + 4 + 6 + 8 + 8 + 8 + 8
    # resumed from iteration 6 (batch 6, in the middle of the ramp-up), as an interrupted run leaves it
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved / f"global_step{RESUME_AT}", ckpt / f"global_step{RESUME_AT}")
    (ckpt / "latest").write_text(f"global_step{RESUME_AT}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(RESUME_AT))
    resumed_proc, resumed_ranks = launch(2, args + ["--load", ckpt], str(tmp_path / "resumed"))
    assert f"loaded checkpoint {ckpt}/global_step{RESUME_AT}/" in resumed_proc.stdout
    # it evaluated one batch of 8 after iterations 8, 10 and 12 and at the end, on top of the
    # 2 + 4 + 6 samples the checkpoint of iteration 6 had consumed
    assert resumed_ranks[1]["consumed_valid_samples"] == (2 + 4 + 6) + 4 * 8
    whole, resumed = validation_losses(proc.stdout), validation_losses(resumed_proc.stdout)
    assert sorted(resumed) == ["iteration 10", "iteration 12", "iteration 8", "the end of training for val data"]
    for name, loss in resumed.items():  # the same held-out samples as the uninterrupted run
        assert float(loss) == pytest.approx(float(whole[name]), rel=1e-5), name
