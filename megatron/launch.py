"""Launch `deepspeed --num_gpus N <script> <flags>` on CPU ranks (gloo) through DeepSpeed's own
launcher, and read the Megatron log lines it prints. Shared by the tests and the benchmarks."""
import base64
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# " iteration  12/  40 | consumed samples: ... | lm loss: 6.4E+00 | ... | samples per second: 17.4 | TFLOPs: 0.01 |"
_FIELD = re.compile(r" ([a-zA-Z][a-zA-Z ()]*?): +([-+0-9.E]+|nan|inf) \|")  # values may be padded
_ITERATION = re.compile(r"^ iteration\s+(\d+)/\s*\d+ \|(.*)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_deepspeed(num_ranks: int, script: str, flags: Iterable[object], env: Mapping[str, str] | None = None,
                  threads_per_rank: int = 1, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """The completed process, stdout and stderr together in `.stdout`; runs from the repository root.

    Runs the command that `deepspeed --num_gpus N` (deepspeed.launcher.runner) execs on a single
    node: DeepSpeed's per-node launcher, which spawns the ranks and sets their environment. The
    runner itself only builds that command, in a process of its own that imports torch and
    DeepSpeed (3-4 s a launch); the README's example scripts, tested in tests/test_examples.py,
    still go through the `deepspeed` command itself."""
    env = dict(os.environ if env is None else env, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads_per_rank),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--log_level=info",
           script] + [str(f) for f in flags]
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def logged_iterations(output: str) -> dict[int, dict[str, float]]:
    """{iteration: {field: value}} from the training log lines, e.g. out[12]["lm loss"]."""
    return {int(m.group(1)): {k: float(v) for k, v in _FIELD.findall(m.group(2) + " ")}
            for m in _ITERATION.finditer(output)}
