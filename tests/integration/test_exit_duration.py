"""--exit-duration-in-mins and --kill-switch-path are decided together: when one rank's clock
passes the limit, or one rank sees the kill-switch file, every rank stops after the same iteration
(otherwise one rank would enter the exit save and its barrier while the others start another step,
and the run would hang)."""
import time

from tests.support.distributed import run_distributed


def _decide(cases, kill_cases, tmp):
    """Each case: minutes since each rank's start; each kill case: whether each rank's kill-switch
    path exists. Returns each case's decision on this rank."""
    import os

    import torch.distributed as dist

    from megatron.config.run_config import ExitSettings
    from megatron.training import exit_signals
    rank = dist.get_rank()
    settings = ExitSettings(exit_interval=None, exit_duration_in_mins=1, kill_switch_path=None)
    late = [exit_signals(time.time() - 60 * minutes[rank], settings)[0] for minutes in cases]
    killed = []
    for i, present in enumerate(kill_cases):
        path = os.path.join(tmp, f"kill_{i}_rank{rank}")  # one path per rank: only some ranks see a file
        if present[rank]:
            open(path, "w").close()
        killed.append(exit_signals(time.time(), ExitSettings(exit_interval=None, exit_duration_in_mins=None,
                                                             kill_switch_path=path)))
    return late, killed


def test_one_late_rank_or_one_kill_switch_stops_every_rank(tmp_path):
    # rank 0 past the limit; rank 1 past it; neither
    late_cases = [[2, 0], [0, 1.5], [0, 0.5]]
    # only rank 0 sees the file; only rank 1; neither
    kill_cases = [[True, False], [False, True], [False, False]]
    results = run_distributed(2, _decide, late_cases, kill_cases, str(tmp_path))
    assert [late for late, _ in results] == [[True, True, False]] * 2
    assert [killed for _, killed in results] == [[(False, True), (False, True), (False, False)]] * 2


def test_a_real_run_stops_every_rank_at_the_same_iteration_and_saves(tmp_path):
    """--exit-duration-in-mins in a PP=2 launch: both stages stop after the same iteration, well
    before --train-iters, each writes its part of that iteration's checkpoint, and the pointers
    name it."""
    from tests.support.launcher import TINY, launch
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
