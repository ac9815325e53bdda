"""--exit-signal-handler and the NaN check in launches as users' clusters run them (TP1 x PP2):

* SIGTERM at every process (what `scancel` and a SLURM time limit do), at one rank only, and at
  the `deepspeed` command only (DeepSpeed's runner passes nothing on to its per-node launcher on a
  single node): every rank finishes the iteration in progress, saves it and exits 0. Each launch
  signals while every rank is paused inside a known iteration (tests/support/pretrain_driver.py,
  DRIVER_PAUSE_AT), so the saved iteration is known exactly: a preemption costs that one iteration
  at most. The run resumed from the preemption's checkpoint gives the uninterrupted run's losses.
* a non-finite loss from a real cause (the resumed run with --lr 1e30, --save-interval 1) stops
  the run with one line naming the iteration and exit code 3; the checkpoint of the iteration
  before, whose weights gave that loss, is kept untracked, the trackers name the one before it, and
  the checkpoint it resumed from is left byte for byte; the same run with
  --no-check-for-nan-in-loss-and-grad (the path without the check) says which iteration went
  non-finite first, and trains on.
* SIGTERM at one rank of a DeepSpeed-Ulysses replica (SP 2): both save the same iteration."""
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from megatron.training.exit_signal import SIGNALS, ExitSignalHandler
from tests.support.launch import ROOT, free_port, logged_iterations
from tests.support.launcher import TINY, launch, losses

ITERS = 6
RUN = TINY + ["--global-batch-size", 4, "--train-iters", ITERS, "--eval-iters", 0,
              "--pipeline-model-parallel-size", 2]
NON_FINITE_EXIT_CODE = 3


def _paused(out, num_ranks, timeout=300):
    """{rank: {"pid", "ppid"}} once every rank has paused inside the iteration (DRIVER_PAUSE_AT)."""
    deadline = time.monotonic() + timeout
    paths = [os.path.join(out, f"rank{r}.paused") for r in range(num_ranks)]
    while not all(os.path.exists(p) for p in paths):
        assert time.monotonic() < deadline, "the ranks never reached the paused iteration"
        time.sleep(0.05)
    found = {}
    for r, path in enumerate(paths):
        with open(path) as f:
            found[r] = json.load(f)
    return found


def _launch_and_signal(monkeypatch, out, args, pause_at, send):
    """The forked launch (tests/support/launcher.py) in a thread; `send(paused ranks)` once all are paused
    inside iteration `pause_at`. Returns (completed process, {rank: driver json})."""
    monkeypatch.setenv("DRIVER_PAUSE_AT", str(pause_at))
    result = {}

    def run():
        result["launch"] = launch(2, args, str(out), check=False)
    thread = threading.Thread(target=run)
    thread.start()
    try:
        send(_paused(str(out), 2))
    finally:
        thread.join(600)
    return result["launch"]


def _step_losses(rank_json):
    return {int(it): loss for it, loss in rank_json["step_losses"].items()}


def _tracked(ckpt):
    return (ckpt / "latest_checkpointed_iteration.txt").read_text()


def _file_hashes(directory):
    return {os.path.relpath(os.path.join(d, name), directory):
            hashlib.sha256(open(os.path.join(d, name), "rb").read()).hexdigest()
            for d, _, names in os.walk(directory) for name in names}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Iterations 1-6 in one launch: the reference every interrupted and resumed run is held to."""
    out = tmp_path_factory.mktemp("uninterrupted")
    proc, ranks = launch(2, RUN, str(out))
    return _step_losses(ranks[1])  # the last stage computes the loss (the first gets it broadcast)


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
    """SIGTERM at every process while both ranks are inside iteration 3, as scancel sends it (the
    ranks read in-process, --num-workers 0: a data loader worker dies of the signal, see README)."""
    tmp = tmp_path_factory.mktemp("preempted")
    ckpt = tmp / "ckpt"
    monkeypatch = pytest.MonkeyPatch()
    try:
        proc, ranks = _launch_and_signal(
            monkeypatch, tmp / "run", RUN + ["--exit-signal-handler", "--save", ckpt], 3,
            lambda paused: [os.kill(rank["pid"], signal.SIGTERM) for rank in paused.values()])
    finally:
        monkeypatch.undo()
    return {"proc": proc, "ranks": ranks, "ckpt": ckpt, "tmp": tmp}


def test_sigterm_at_every_process_saves_the_iteration_in_progress(preempted, uninterrupted):
    proc, ranks, ckpt = preempted["proc"], preempted["ranks"], preempted["ckpt"]
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert "--exit-signal-handler: SIGTERM; saving and exiting after iteration 3\n" in proc.stdout
    assert "exiting program at iteration 3\n" in proc.stdout
    assert [ranks[r]["iteration"] for r in (0, 1)] == [3, 3]
    assert _tracked(ckpt) == "3"
    assert sorted(os.listdir(ckpt)) == ["global_step3", "latest", "latest_checkpointed_iteration.txt"]
    # iterations 1-3 ran as in the uninterrupted run, on both stages
    for r in (0, 1):
        assert _step_losses(ranks[r]) == {it: uninterrupted[it] for it in (1, 2, 3)}


def test_the_run_resumed_after_the_preemption_continues_exactly(preempted, uninterrupted):
    proc, ranks = launch(2, RUN + ["--load", preempted["ckpt"]], str(preempted["tmp"] / "resumed"))
    assert f"loaded checkpoint {preempted['ckpt']}/global_step3/" in proc.stdout
    assert _step_losses(ranks[1]) == {it: uninterrupted[it] for it in (4, 5, 6)}
    assert sorted(losses(proc.stdout)) == [4, 5, 6]


def test_sigterm_at_one_rank_stops_every_rank_after_the_same_iteration(tmp_path, monkeypatch, uninterrupted):
    ckpt = tmp_path / "ckpt"
    proc, ranks = _launch_and_signal(monkeypatch, tmp_path / "run", RUN + ["--exit-signal-handler", "--save", ckpt],
                                     2, lambda paused: os.kill(paused[1]["pid"], signal.SIGTERM))
    assert proc.returncode == 0, proc.stdout[-6000:]
    # rank 0 got nothing itself: the all-reduced flag told it
    assert ("--exit-signal-handler: another rank received SIGTERM or lost its launcher; "
            "saving and exiting after iteration 2\n") in proc.stdout
    assert [ranks[r]["iteration"] for r in (0, 1)] == [2, 2]
    assert _tracked(ckpt) == "2"
    assert _step_losses(ranks[1]) == {it: uninterrupted[it] for it in (1, 2)}


def test_sigterm_at_one_ulysses_rank_saves_the_iteration_on_both(tmp_path, monkeypatch):
    """DeepSpeed-Ulysses, SP 2 (the two ranks hold one replica, each half of every sequence): the
    signal at rank 1 alone stops both after iteration 2, and the save, which gathers both SP ranks'
    RNG states, completes: the tracked checkpoint verifies against its manifest."""
    from megatron.checkpoint.manifest import read_manifest, verify_share
    ckpt = tmp_path / "ckpt"
    run = TINY + ["--global-batch-size", 4, "--train-iters", ITERS, "--eval-iters", 0, "--no-pipeline-parallel",
                  "--ds-sequence-parallel-size", 2, "--exit-signal-handler", "--save", ckpt]
    proc, ranks = _launch_and_signal(monkeypatch, tmp_path / "run", run, 2,
                                     lambda paused: os.kill(paused[1]["pid"], signal.SIGTERM))
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert ("--exit-signal-handler: another rank received SIGTERM or lost its launcher; "
            "saving and exiting after iteration 2\n") in proc.stdout
    assert [ranks[r]["iteration"] for r in (0, 1)] == [2, 2]
    assert _tracked(ckpt) == "2"
    step = str(ckpt / "global_step2")
    assert verify_share(step, read_manifest(step), 0, 1) is None


def test_sigterm_to_the_deepspeed_command_alone_saves_and_ends_every_rank(tmp_path):
    """The real `deepspeed` runner -> `deepspeed.launcher.launch` -> ranks. SIGTERM to the runner
    alone kills it (it installs no handler on a single node) and nothing reaches the ranks: each
    rank sees its launcher's parent go, saves the iteration it is in, and exits; the per-node
    launcher then exits with its ranks, and no process of the job is left."""
    import psutil
    runner = shutil.which("deepspeed")
    assert runner, "DeepSpeed's `deepspeed` command is not on PATH"
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    out.mkdir()
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", DRIVER_OUT=str(out), DRIVER_PAUSE_AT="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [runner, "--num_gpus", "2", "--master_port", str(free_port()), "tests/support/pretrain_driver.py",
           *map(str, RUN + ["--exit-signal-handler", "--save", ckpt])]
    with open(tmp_path / "output.txt", "w+") as output:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            paused = _paused(str(out), 2)
            launchers = {rank["ppid"] for rank in paused.values()}
            assert len(launchers) == 1 and psutil.Process(launchers.pop()).ppid() == proc.pid
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == -signal.SIGTERM  # the runner dies at once, as DeepSpeed wrote it
            job = [psutil.Process(pid) for pid in [paused[0]["ppid"], paused[0]["pid"], paused[1]["pid"]]]
            _, alive = psutil.wait_procs(job, timeout=300)
            assert not alive, f"left running: {alive}"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output.seek(0)
        text = output.read()
    assert "saving and exiting after iteration 2\n" in text, text[-6000:]
    assert "exiting program at iteration 2\n" in text
    assert f"--exit-signal-handler: its launcher (PID {proc.pid}) exited" in text
    assert _tracked(ckpt) == "2"
    for r in (0, 1):  # each rank got to the driver's end: it returned from the run normally
        with open(out / f"rank{r}.json") as f:
            assert json.load(f)["iteration"] == 2


def test_a_non_finite_loss_stops_the_run_and_untracks_the_weights_that_gave_it(preempted):
    """Resumed from the preemption's checkpoint (iteration 3) with --lr 1e30: the weights blow up.
    First the run without the check, on a copy: which iteration's logged loss or gradient norm is
    the first non-finite one. Then the checked run, saving every iteration, stops right there; the
    weights saved at the iteration before (finite, blown up) gave that loss."""
    tmp = preempted["tmp"]
    bad_lr = ["--lr", "1e30", "--override-opt_param-scheduler", "--save-interval", 1]
    unchecked_ckpt = tmp / "unchecked_ckpt"
    shutil.copytree(preempted["ckpt"], unchecked_ckpt)
    proc, _ = launch(2, RUN + bad_lr + ["--load", unchecked_ckpt, "--no-check-for-nan-in-loss-and-grad"],
                     str(tmp / "unchecked"))
    # the log line's values as printed (Python writes a non-finite float as NAN / INF / nan / inf)
    logged = {int(it): [float(value) for value in values]
              for it, *values in re.findall(r"^ iteration +(\d+)/.* lm loss: (\S+) \|.* grad norm: (\S+) \|",
                                            proc.stdout, re.MULTILINE)}
    assert sorted(logged) == [4, 5, 6]  # trains on to the end
    first_bad = min(it for it, values in logged.items() if not all(map(math.isfinite, values)))

    ckpt = tmp / "checked_ckpt"
    shutil.copytree(preempted["ckpt"], ckpt)
    before = _file_hashes(ckpt / "global_step3")
    # through pretrain_gpt.py's own entry point, as users launch it
    proc, _ = launch(2, RUN + bad_lr + ["--load", ckpt, "--save", ckpt], str(tmp / "checked"), check=False,
                     script="pretrain_gpt.py")
    assert proc.returncode == NON_FINITE_EXIT_CODE, proc.stdout[-6000:]
    [line] = [line for line in proc.stdout.splitlines() if "is not finite" in line]
    assert line.startswith(f"stopping at iteration {first_bad}: the lm loss (")
    # iteration 4's loss came from the loaded (sane) weights: the first bad one is later
    suspect, sane = first_bad - 1, first_bad - 2
    assert sane >= 3
    assert line.endswith(f"nothing saved at this iteration; --save {ckpt}: global_step{suspect} held the weights "
                         f"that produced it, kept untracked as global_step{suspect}.suspect; global_step{sane} is the "
                         "tracked checkpoint. Resume with a lower --lr or skip the data from that update on with "
                         f"--skip-train-iteration-range {suspect}-{first_bad} (--no-check-for-nan-in-loss-and-grad "
                         "trains on)")
    assert "Traceback" not in proc.stdout
    assert sorted(logged_iterations(proc.stdout)) == list(range(4, first_bad))  # nothing logged from it
    assert _tracked(ckpt) == str(sane) and (ckpt / "latest").read_text() == f"global_step{sane}"
    assert sorted(os.listdir(ckpt)) == sorted([f"global_step{it}" for it in range(3, suspect)]
                                              + [f"global_step{suspect}.suspect", "latest",
                                                 "latest_checkpointed_iteration.txt"])
    assert _file_hashes(ckpt / "global_step3") == before  # the loaded checkpoint: every byte as it was


def test_the_handler_takes_the_chosen_signal_and_gives_it_back():
    """In-process: --exit-signal SIGUSR1 sets `received` (the process lives on), a second signal
    changes nothing, and release restores the previous handler."""
    previous = signal.getsignal(signal.SIGUSR1)
    handler = ExitSignalHandler("SIGUSR1", watch_launcher=False).install()
    try:
        assert handler.received is None
        os.kill(os.getpid(), SIGNALS["SIGUSR1"])
        os.kill(os.getpid(), SIGNALS["SIGUSR1"])
        assert handler.received == "SIGUSR1"
    finally:
        handler.release()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_rank_whose_parent_exits_asks_for_the_exit(tmp_path):
    """A process whose parent is killed (SIGKILL: no chance to pass anything on) sees it within
    the watch interval and asks for the exit, naming the parent."""
    child = ("import os, sys, time\n"
             "from megatron.training.exit_signal import ExitSignalHandler\n"
             "h = ExitSignalHandler().install()\n"
             "print(os.getpid(), flush=True)\n"
             "deadline = time.monotonic() + 60\n"
             "while h.received is None and time.monotonic() < deadline:\n"
             "    time.sleep(0.05)\n"
             f"open({str(tmp_path / 'why')!r}, 'w').write(str(h.received))\n")
    parent = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
              "time.sleep(600)\n")
    middle = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    pid = int(middle.stdout.readline())
    middle.kill()
    middle.wait()
    why, deadline = tmp_path / "why", time.monotonic() + 60
    while not (why.exists() and why.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert why.read_text() == f"its launcher (PID {middle.pid}) exited"
    assert pid != middle.pid
