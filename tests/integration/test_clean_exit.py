"""A finished run exits 0, with everything it wrote on disk; a run that fails still exits non-zero;
each outcome of pretrain_gpt.py's entry point has its own exit code (docs/long-runs.md#exit-codes).

Before the fix, about one short PP=2 launch in eight ended its last iteration and then died in
interpreter teardown (`terminate called without an active exception`, status 250) while gloo's
threads released the last collective's tensors; a refusal's sys.exit(2) did the same about one
2-rank `deepspeed` launch in five (tests/integration/test_checkpoint_faults.py launches them). The
launches here go through pretrain_gpt.py's own entry point (every other launch of the suite goes
through tests/support/pretrain_driver.py, which ends the same way, and checks its exit code too)."""
import os
import subprocess
import sys

import pytest

from tests.support.launch import ROOT, logged_iterations, run_deepspeed
from tests.support.launcher import TINY

ITERS = 3
RUN = TINY + ["--global-batch-size", 4, "--train-iters", ITERS, "--eval-iters", 0, "--tensorboard-queue-size", 1000]


def _last_scalar_steps(tb_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_short_runs_at_pp2_and_tp2_exit_0(tmp_path):
    # one of each: every other launch in the suite checks its exit status too (about 30 of them)
    for launch, layout in enumerate([["--pipeline-model-parallel-size", 2], ["--tensor-model-parallel-size", 2]]):
        tb = tmp_path / f"tb{launch}"
        proc = run_deepspeed(2, "pretrain_gpt.py", RUN + layout + ["--tensorboard-dir", tb], timeout=600)
        # 0 only if both ranks exited 0 (run_deepspeed returns the first failing rank's code)
        assert proc.returncode == 0, f"launch {launch} {layout}: exit {proc.returncode}\n{proc.stdout[-4000:]}"
        assert "terminate called" not in proc.stdout
        assert sorted(logged_iterations(proc.stdout)) == list(range(1, ITERS + 1))
        # the TensorBoard writer (on the last rank, 1000 events queued) was flushed before the exit
        assert _last_scalar_steps(tb, "lm-loss-training/lm loss") == list(range(1, ITERS + 1))


def test_exit_runs_the_exit_handlers_and_flushes_but_skips_teardown():
    """exit_after_success, in a process of its own: buffered output and registered exit handlers
    (logging's flush, a library's clean-up) happen; the interpreter's teardown (here a destructor
    that would change the exit code) does not."""
    code = ("import atexit, sys\n"
            "from megatron.runtime.process_exit import exit_after_success\n"
            "atexit.register(lambda: print('exit handler ran'))\n"
            "class Teardown:\n"
            "    def __del__(self):\n"
            "        print('teardown ran')\n"
            "keep = Teardown()\n"
            "sys.stdout.write('buffered, no newline')\n"
            "exit_after_success()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "buffered, no newlineexit handler ran\n"


def test_a_run_that_fails_after_training_exits_non_zero(tmp_path):
    """The checkpoint save at the end of training fails (a disk error: every torch.save raises
    EIO, pretrain_gpt.py run as its own __main__ otherwise as is; a --save directory that is unusable
    from the start is refused at startup instead, test_save_dir_startup): the exception unwinds
    through the interpreter and the exit status says so."""
    code = ("import errno, runpy, torch\n"
            "def failing_save(*args, **kwargs):\n"
            "    raise OSError(errno.EIO, 'Input/output error')\n"
            "torch.save = failing_save\n"
            "runpy.run_path('pretrain_gpt.py', run_name='__main__')\n")
    cmd = [sys.executable, "-c", code] + [str(f) for f in RUN + ["--save", tmp_path / "ckpt"]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DS_ACCELERATOR="cpu", WORLD_SIZE="1", OMP_NUM_THREADS="1",
                                   PYTHONPATH=ROOT))
    assert f" iteration        {ITERS}/" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr and "OSError: [Errno 5] Input/output error" in proc.stderr


# pretrain_gpt.py run as `python pretrain_gpt.py` runs it, in a process that also holds an object whose
# destructor only the interpreter's teardown would call; `PATCH` (optional) replaces the trainer's
# pretrain() first, for outcomes no flag produces
_ENTRY_POINT = """
import runpy, sys
class Teardown:
    def __del__(self):
        print("teardown ran", flush=True)
keep = Teardown()
PATCH
sys.argv = ["pretrain_gpt.py", *sys.argv[1:]]
runpy.run_path("pretrain_gpt.py", run_name="__main__")
"""
_RAISE = "import megatron.training\ndef boom(*args, **kwargs):\n    raise {}\nmegatron.training.pretrain = boom"


def _entry_point(flags, patch=""):
    return subprocess.run([sys.executable, "-c", _ENTRY_POINT.replace("PATCH", patch), *map(str, flags)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DS_ACCELERATOR="cpu", WORLD_SIZE="1", RANK="0", OMP_NUM_THREADS="1",
                                   PYTHONPATH=ROOT))


@pytest.mark.parametrize("outcome, patch, code, last_line", [
    # refused once torch.distributed exists (the tokenizer's 8192 tokens are known only then)
    ("refused", "", 2, "pretrain_gpt.py: error: --pad-vocab-size-to 4096 is below the tokenizer's 8192 tokens"),
    ("crashed", _RAISE.format("RuntimeError('an unexpected error')"), 1, "RuntimeError: an unexpected error"),
    ("interrupted", _RAISE.format("KeyboardInterrupt"), 130,
     "pretrain_gpt.py: interrupted (SIGINT); nothing saved since the last checkpoint"),
], ids=["refused", "crashed", "interrupted"])
def test_each_outcome_has_its_exit_code_and_skips_teardown(outcome, patch, code, last_line):
    flags = [f for f in RUN if f not in ("--vocab-size", "600")] + [
        "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt", "--pad-vocab-size-to", 4096]
    proc = _entry_point(flags, patch)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(last_line), proc.stderr[-3000:]
    assert ("Traceback" in proc.stderr) == (outcome == "crashed")
    assert "teardown ran" not in proc.stdout
