"""Activation checkpointing recomputes the forward with the same dropout masks (TP-aware RNG
states are replayed), so it changes the cost, not the training: with dropout on, the loss
trajectory equals the run without checkpointing, with our checkpoint function and with
DeepSpeed's (partitioned activations)."""
import pytest

from launcher import TINY, launch

ITERS = 4


def dropout_on(args):
    out = list(args)
    for flag in ("--hidden-dropout", "--attention-dropout"):
        out[out.index(flag) + 1] = "0.1"
    return out


@pytest.mark.parametrize("pipeline", [False, True])
def test_checkpointing_keeps_the_loss_trajectory(pipeline, tmp_path):
    args = dropout_on(TINY) + ["--tensor-model-parallel-size", 2, "--global-batch-size", 4, "--train-iters", ITERS]
    if not pipeline:
        args.append("--no-pipeline-parallel")
    runs = {}
    for name, extra in (("plain", []), ("ours", ["--checkpoint-activations"]),
                        ("deepspeed", ["--checkpoint-activations", "--deepspeed-activation-checkpointing",
                                       "--partition-activations"])):
        _, results = launch(2, args + extra, str(tmp_path / name))
        runs[name] = [results[1]["losses"][str(i)] for i in range(1, ITERS + 1)]
    assert runs["ours"] == pytest.approx(runs["plain"], rel=1e-6, abs=0)
    assert runs["deepspeed"] == pytest.approx(runs["plain"], rel=1e-6, abs=0)
