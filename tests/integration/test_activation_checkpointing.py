"""Activation checkpointing recomputes the forward with the same dropout masks (TP-aware RNG
states are replayed), so it changes the cost, not the training: with dropout on, the loss
trajectory equals the run without checkpointing, with our checkpoint function and with
DeepSpeed's (partitioned activations).

The three runs of each engine are whole `pretrain_gpt.main` runs (arguments, initialisation,
model, DeepSpeed engine, training loop) one after the other on the same 2 gloo processes, rather
than three `deepspeed` launches: initialisation reseeds every generator, and DeepSpeed's
checkpointing, which stays configured once a run configures it, comes last."""
import pytest

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY

ITERS = 4


def dropout_on(args):
    out = list(args)
    for flag in ("--hidden-dropout", "--attention-dropout"):
        out[out.index(flag) + 1] = "0.1"
    return out


def _trajectories(runs):
    """{name: {iteration: loss}} of each run, as the trainer logged it (at full precision)."""
    from tests.support import pretrain_driver  # its hooks record every logged loss
    out = {}
    for name, argv in runs:
        pretrain_driver.state["losses"] = {}
        args, progress = pretrain_driver.run([str(a) for a in argv])
        assert progress.iteration == ITERS and args.checkpoint_activations == ("--checkpoint-activations" in argv)
        out[name] = dict(pretrain_driver.state["losses"])
    return out


@pytest.mark.parametrize("pipeline", [False, True])
def test_checkpointing_keeps_the_loss_trajectory(pipeline):
    args = dropout_on(TINY) + ["--tensor-model-parallel-size", 2, "--global-batch-size", 4, "--train-iters", ITERS]
    if not pipeline:
        args.append("--no-pipeline-parallel")
    runs = [("plain", args), ("ours", args + ["--checkpoint-activations"]),
            ("deepspeed", args + ["--checkpoint-activations", "--deepspeed-activation-checkpointing",
                                  "--partition-activations"])]  # last: see the module's docstring
    _, results = run_distributed(2, _trajectories, runs, tp=2)
    trajectory = {name: [results[name][i] for i in range(1, ITERS + 1)] for name, _ in runs}
    assert trajectory["ours"] == pytest.approx(trajectory["plain"], rel=1e-6, abs=0)
    assert trajectory["deepspeed"] == pytest.approx(trajectory["plain"], rel=1e-6, abs=0)
