"""tests/support/launch.py's run_deepspeed starts the ranks itself, without DeepSpeed's launcher process:
each rank must see exactly what DeepSpeed's per-node launcher (what `deepspeed --num_gpus N` execs)
gives it, and a failing rank must end the launch with its exit code, as there."""
import base64
import json
import os
import subprocess
import sys

import pytest

from tests.support.launch import ROOT, free_port, run_deepspeed

PROBE = os.path.join("tests", "support", "launch_probe.py")
FLAGS = ["--num-layers", "2", "--seq-length", "32"]


def _probes(out_dir):
    """{rank: {"argv": ..., "env": ...}} as each rank wrote it to out_dir/rank<RANK>.json."""
    return {int(name[len("rank"):-len(".json")]): json.loads((out_dir / name).read_text())
            for name in os.listdir(out_dir) if name.endswith(".json")}


def _under_deepspeeds_launcher(num_ranks, env, out_dir):
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    port = free_port()
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
           "--master_addr=127.0.0.1", f"--master_port={port}", PROBE, str(out_dir), *FLAGS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout
    return _probes(out_dir), port


@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "forked"])
def test_ranks_see_what_deepspeeds_launcher_gives_them(tmp_path, fork):
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    proc = run_deepspeed(2, PROBE, [tmp_path / "ours", *FLAGS], timeout=120, fork=fork)
    assert proc.returncode == 0, proc.stdout
    ours = _probes(tmp_path / "ours")
    # DeepSpeed's launcher, started with the environment run_deepspeed hands its ranks
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    theirs, port = _under_deepspeeds_launcher(2, env, tmp_path / "theirs")
    assert sorted(ours) == sorted(theirs) == [0, 1]
    for rank in (0, 1):
        assert ours[rank]["argv"][0] == theirs[rank]["argv"][0] == f"--local_rank={rank}"
        assert ours[rank]["argv"][2:] == theirs[rank]["argv"][2:] == FLAGS
        assert ours[rank]["cwd"] == theirs[rank]["cwd"] == ROOT
        assert ours[rank]["path0"] == theirs[rank]["path0"] == os.path.join(ROOT, "tests", "support")
        assert ours[rank]["threads"] == theirs[rank]["threads"] == 1  # OMP_NUM_THREADS=1
        mine, deepspeeds = dict(ours[rank]["env"]), dict(theirs[rank]["env"])
        assert deepspeeds.pop("MASTER_PORT") == str(port)  # each launch picks a free port
        assert int(mine.pop("MASTER_PORT")) > 0
        assert mine == deepspeeds
        assert (mine["RANK"], mine["LOCAL_RANK"], mine["WORLD_SIZE"], mine["LOCAL_SIZE"]) == (str(rank), str(rank),
                                                                                                 "2", "2")


@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "forked"])
def test_a_failing_rank_stops_the_others_and_its_code_is_the_launchs(tmp_path, fork):
    """Rank 1 exits 3 while rank 0 would wait forever: the launch ends with exit code 3 and rank 0
    is gone (stopped and reaped) when it returns."""
    import psutil
    pid_file = tmp_path / "rank0.pid"
    proc = run_deepspeed(2, PROBE, ["fail", pid_file], timeout=120, fork=fork)
    assert proc.returncode == 3
    assert "rank 1 exits with 3\n" in proc.stdout  # what a rank writes to stderr reaches the launch's output
    assert not psutil.pid_exists(int(pid_file.read_text()))
