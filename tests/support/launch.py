"""Launch `deepspeed --num_gpus N <script> <flags>` on CPU ranks (gloo), the ranks set up as
DeepSpeed's launcher sets them up, and read the Megatron log lines they print. Shared by the tests
and the benchmarks; the tests fork their ranks from a server that has imported torch, DeepSpeed
and the trainer once (`preloaded_context`), the benchmarks start fresh interpreters."""
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# " iteration  12/  40 | consumed samples: ... | lm loss: 6.4E+00 | ... | samples per second: 17.4 | TFLOPs: 0.01 |"
_FIELD = re.compile(r" ([a-zA-Z][a-zA-Z ()]*?): +([-+0-9.E]+|nan|inf) \|")  # values may be padded
_ITERATION = re.compile(r"^ iteration\s+(\d+)/\s*\d+ \|(.*)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env(num_ranks: int, master_port: int) -> dict[str, str]:
    """What DeepSpeed's per-node launcher (deepspeed.launcher.launch) sets for the ranks of one node
    on CPU, besides RANK and LOCAL_RANK (tests/integration/test_launch.py compares it with the launcher's)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port), "WORLD_SIZE": str(num_ranks),
            "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": str(num_ranks),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(num_ranks)))}  # its CPU accelerator sets it too


def run_deepspeed(num_ranks: int, script: str, flags: Iterable[object], env: Mapping[str, str] | None = None,
                  threads_per_rank: int = 1, timeout: float | None = None,
                  fork: bool = False) -> subprocess.CompletedProcess[str]:
    """The completed process, stdout and stderr of every rank together in `.stdout`, each rank's exit
    status in `.rank_returncodes` (a rank the launch stopped: what that stop gave); runs from the
    repository root.

    Starts the ranks as `deepspeed --num_gpus N` does on a single node: `python -u script
    --local_rank=i flags` with the environment DeepSpeed's per-node launcher gives them
    (`launcher_env`, RANK, LOCAL_RANK); when a rank fails the others are stopped and its exit code
    is the launch's, as there. DeepSpeed's runner and launcher are two processes that each import
    torch and DeepSpeed before any rank starts (~4 s apiece), so they are left out here;
    tests/integration/test_launch.py checks that the ranks see the same as under DeepSpeed's launcher, and the
    README's example scripts, tested in tests/integration/test_examples.py, go through the `deepspeed` command.

    fork=True (the tests): each rank is forked from `preloaded_context()`'s server instead of
    starting a fresh interpreter that imports torch, DeepSpeed and torch._dynamo (~6 s of CPU per
    rank), and runs the script as `python -u` would (`_forked_rank`) but without the interpreter's
    teardown. The caller's environment must name the CPU accelerator (DS_ACCELERATOR=cpu), which
    the server resolves at import."""
    base = dict(os.environ if env is None else env, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads_per_rank),
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **launcher_env(num_ranks, free_port()))
    # the launcher's own `import deepspeed` sets it (setdefault) in the environment the ranks inherit
    base.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    argv = [str(f) for f in flags]
    cmd = [sys.executable, "-u", script, *argv]
    with tempfile.NamedTemporaryFile("w+") as out:  # every rank appends to it, as to the launcher's stdout
        ranks: list[subprocess.Popen | _ForkedRank] = []
        try:
            for rank in range(num_ranks):
                rank_env, rank_argv = dict(base, RANK=str(rank), LOCAL_RANK=str(rank)), [f"--local_rank={rank}", *argv]
                if fork:
                    ranks.append(_ForkedRank(script, rank_argv, rank_env, out.name))
                else:
                    ranks.append(subprocess.Popen([*cmd[:3], *rank_argv], cwd=ROOT, env=rank_env, stdout=out,
                                                  stderr=subprocess.STDOUT))
            returncode = _wait_for_ranks(ranks, timeout, cmd)
        finally:  # a failed rank, the timeout or an interrupt: no rank outlives the launch
            _stop(ranks)
        out.seek(0)
        completed = subprocess.CompletedProcess(cmd, returncode, out.read())
        completed.rank_returncodes = [rank.poll() for rank in ranks]  # type: ignore[attr-defined]
        return completed


# what every rank imports: DeepSpeed (its accelerator resolved at import), torch._dynamo (the first
# torch.optim optimizer imports it, ~2.5 s) and the trainer
PRELOAD = ["deepspeed", "torch._dynamo", "megatron.training.pretrain", "pretrain_gpt"]


def preloaded_context() -> multiprocessing.context.ForkServerContext:
    """multiprocessing's fork server, which imports PRELOAD once when it starts; every process of
    this context is forked from it. It runs no torch op, so there is no thread pool to fork."""
    if os.environ.get("DS_ACCELERATOR") != "cpu":
        raise RuntimeError("the preloaded fork server resolves DeepSpeed's accelerator at import: "
                           "set DS_ACCELERATOR=cpu before the first forked launch")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class _ForkedRank:
    """A rank forked from the preloaded server, with what the launch uses of Popen's interface."""

    def __init__(self, script: str, argv: list[str], env: dict[str, str], output: str) -> None:
        self.process = preloaded_context().Process(target=_forked_rank, args=(script, argv, env, output))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


def _forked_rank(script: str, argv: list[str], env: dict[str, str], output: str) -> None:
    """In the forked process: what `python -u script argv` started from ROOT with `env` does, its
    stdout and stderr appended to `output`, up to the exit (exit handlers run, then the process
    ends without the interpreter's teardown, as the trainer's own successful exit does)."""
    import atexit
    import io
    import runpy
    import traceback

    import torch
    out = os.open(output, os.O_WRONLY | os.O_APPEND)
    for fd in (1, 2):
        os.dup2(out, fd)
    os.close(out)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    # the server's OpenMP read its own OMP_NUM_THREADS when torch was imported: apply the rank's
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # run_deepspeed always sets it
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # as the interpreter treats sys.exit(...)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the interpreter runs at exit (non-daemon threads are not waited for)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait_for_ranks(ranks: list[subprocess.Popen | _ForkedRank], timeout: float | None, cmd: list[str]) -> int:
    """0 once every rank has exited 0; else, as soon as a rank has failed, its code (the lowest
    rank's when several have)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [rank.poll() for rank in ranks]
        failed = [code for code in codes if code not in (None, 0)]
        if failed or None not in codes:
            return failed[0] if failed else 0
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(cmd, timeout)
        time.sleep(0.05)


def _stop(ranks: list[subprocess.Popen | _ForkedRank]) -> None:
    """SIGTERM to every live rank and its children (data loader workers), SIGKILL after 10 s."""
    import psutil  # a DeepSpeed dependency
    procs = []
    for rank in ranks:
        if rank.poll() is None:
            try:
                parent = psutil.Process(rank.pid)
                procs += [*parent.children(recursive=True), parent]
            except psutil.NoSuchProcess:
                pass
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        proc.kill()
    for rank in ranks:
        rank.wait()


def logged_iterations(output: str) -> dict[int, dict[str, float]]:
    """{iteration: {field: value}} from the training log lines, e.g. out[12]["lm loss"]."""
    return {int(m.group(1)): {k: float(v) for k, v in _FIELD.findall(m.group(2) + " ")}
            for m in _ITERATION.finditer(output)}
