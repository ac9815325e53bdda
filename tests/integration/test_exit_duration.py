"""--exit-duration-in-mins and --kill-switch-path are decided together: when one rank's clock
passes the limit, or one rank sees the kill-switch file, every rank stops after the same iteration
(otherwise one rank would enter the exit save and its barrier while the others start another step,
and the run would hang). The budget counts from the earliest rank's process start and is spent
once one more iteration and a save would not fit (megatron/training/time_budget.py)."""
import re
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


def _startup(out):
    """(budget start, first save's estimate, predicted checkpoint bytes) from the startup line."""
    match = re.search(r"^--exit-duration-in-mins [\d.e-]+: [\d.]+ s from ([\d.]+) \(.*\); until a save is measured, "
                      r"one is estimated at ([\d.]+) s \((\d+) bytes predicted\)$", out, re.MULTILINE)
    assert match, out[-3000:]
    return float(match.group(1)), float(match.group(2)), int(match.group(3))


def _check_decisions(ranks, seconds, start):
    """Every decision the ranks agreed on, checked by hand: the same numbers on both ranks; `late`
    exactly when used + longest iteration + save > the budget; the time used counted from `start`
    (it covers each rank's own step, which ended before the decision); the longest iteration at
    least each step any rank has timed itself. Returns the decisions."""
    decisions = ranks[0]["stop_flags"]
    assert decisions and all(r["stop_flags"] == decisions for r in ranks.values())
    for iteration, late, used, longest, save in decisions:
        assert late == (used + longest + save > seconds), (iteration, used, longest, save, seconds)
        steps = [r["step_times"][str(i)] for r in ranks.values() for i in range(1, iteration + 1)
                 if str(i) in r["step_times"]]
        if str(iteration) in ranks[0]["step_times"]:
            assert used >= max(r["step_times"][str(iteration)][1] for r in ranks.values()) - start - 0.001
        assert longest >= max((end - begin for begin, end in steps), default=0.0)
    return decisions


def test_the_budget_counts_from_the_process_start_and_keeps_room_for_an_iteration_and_a_save(tmp_path):
    """PP=2: a run with a budget it cannot spend (6 iterations), then its resumption with a budget
    sized from the first run's own times, which stops, saved, once one more iteration and a save
    would not fit; both stages at the same iteration, each decision checked by hand."""
    from tests.support.launcher import TINY, launch
    ckpt = tmp_path / "ckpt"
    common = TINY + ["--global-batch-size", 2, "--pipeline-model-parallel-size", 2, "--save", ckpt, "--eval-iters", 0]
    proc, first = launch(2, common + ["--train-iters", 6, "--save-interval", 3, "--exit-duration-in-mins", 60],
                         str(tmp_path / "first"))
    start, _, predicted = _startup(proc.stdout)
    # the earliest rank's process start (read by hand from /proc; printed to the millisecond)
    assert abs(start - min(r["process_start"] for r in first.values())) <= 0.002
    decisions = _check_decisions(first, 3600.0, start)
    assert [d[0] for d in decisions] == [0, 1, 2, 3, 4, 5, 6] and not any(d[1] for d in decisions)
    # the prediction is about the size of a real checkpoint (the tied embedding's copy counted, not saved)
    size = sum(p.stat().st_size for p in (ckpt / "global_step6").iterdir())
    assert abs(size - predicted) <= 0.1 * size, (size, predicted)

    # three times what the first run used, from its process start to its last decision: time for its
    # start-up, the load and some iterations
    minutes = round(3 * decisions[-1][2] / 60, 6)
    seconds = 60 * minutes
    proc, ranks = launch(2, common + ["--load", ckpt, "--override-opt_param-scheduler", "--train-iters", 100000,
                                      "--save-interval", 10, "--log-interval", 50, "--exit-duration-in-mins", minutes],
                         str(tmp_path / "second"))
    start, estimate, _ = _startup(proc.stdout)
    assert abs(start - min(r["process_start"] for r in ranks.values())) <= 0.002
    decisions = _check_decisions(ranks, seconds, start)
    [stopped] = {r["iteration"] for r in ranks.values()}
    # one decision before the first iteration, then one after each; only the last one is late
    assert [d[0] for d in decisions] == list(range(6, stopped + 1)) and 6 < stopped < 100000
    assert [d[1] for d in decisions] == [False] * (len(decisions) - 1) + [True]
    # the save's time: the estimate until the first save (iteration 10), then measured
    for iteration, _, _, _, save in decisions:
        assert (abs(save - estimate) <= 0.0005) == (iteration < 10), (iteration, save, estimate)
    used, longest, save = decisions[-1][2:]
    assert (f"--exit-duration-in-mins: {used:.3f} s used of {seconds:.3f} s; one more iteration ({longest:.3f} s, the "
            f"longest so far) and a save ({save:.3f} s, the last save) would not fit: stopping after iteration "
            f"{stopped}\n") in proc.stdout
    assert f"exiting program at iteration {stopped}\n" in proc.stdout
    for r in ranks.values():  # every rank ran exactly those iterations
        assert sorted(map(int, r["step_losses"])) == list(range(7, stopped + 1))
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(stopped)
    step = ckpt / f"global_step{stopped}"
    # each stage's own files: its layers (the embedding and layer 1 on stage 0, layer 2, the final
    # norm and the tied embedding copy on stage 1) and its model-parallel state
    files = sorted(p.name for p in step.iterdir())
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= set(files), files
    assert {"layer_01-model_00-model_states.pt", "layer_02-model_00-model_states.pt"} <= set(files), files
