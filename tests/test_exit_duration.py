"""--exit-duration-in-mins is decided together: when one rank's clock passes the limit every rank
stops after the same iteration (otherwise one rank would enter the exit save and its barrier
while the others start another step, and the run would hang)."""
import argparse
import time

from distributed import run_distributed


def _decide(cases):
    """Each case: minutes since each rank's start; returns each case's decision on this rank."""
    import torch.distributed as dist

    from megatron.training import _out_of_time
    args = argparse.Namespace(exit_duration_in_mins=1)
    return [_out_of_time(time.time() - 60 * minutes[dist.get_rank()], args) for minutes in cases]


def test_one_late_rank_stops_every_rank():
    # rank 0 past the limit; rank 1 past it; neither
    assert run_distributed(2, _decide, [[2, 0], [0, 1.5], [0, 0.5]]) == [[True, True, False]] * 2


def test_a_real_run_stops_every_rank_at_the_same_iteration_and_saves(tmp_path):
    """--exit-duration-in-mins in a PP=2 launch: both stages stop after the same iteration, well
    before --train-iters, each writes its part of that iteration's checkpoint, and the pointers
    name it."""
    from launcher import TINY, launch
    ckpt = tmp_path / "ckpt"
    # 0.02 min = 1.2 s of training: a few iterations of this model, far fewer than 10000
    args = TINY + ["--global-batch-size", 2, "--train-iters", 10000, "--pipeline-model-parallel-size", 2,
                   "--exit-duration-in-mins", 0.02, "--save", ckpt, "--eval-iters", 0]
    proc, ranks = launch(2, args, str(tmp_path / "run"))
    stopped = {r["iteration"] for r in ranks.values()}
    assert len(ranks) == 2 and len(stopped) == 1, stopped
    [iteration] = stopped
    assert 1 <= iteration < 10000
    for r in ranks.values():  # every rank ran exactly those iterations
        assert sorted(map(int, r["step_losses"])) == list(range(1, iteration + 1))
    assert f"exiting program at iteration {iteration}\n" in proc.stdout
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(iteration)
    step = ckpt / f"global_step{iteration}"
    # each stage's own files: its layers (the embedding and layer 1 on stage 0, layer 2, the final
    # norm and the tied embedding copy on stage 1) and its model-parallel state
    files = sorted(p.name for p in step.iterdir())
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= set(files), files
    assert {"layer_01-model_00-model_states.pt", "layer_02-model_00-model_states.pt"} <= set(files), files
