"""A refused run prints its one error line once per job, not once per rank, and exits with code 2;
unknown flags are named together in that one line (megatron/runtime/refusal.py, megatron/config/arguments.py)."""
import os
import signal
import subprocess
import sys
import time

from tests.support.launcher import TINY, launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = TINY + ["--train-iters", "2"]
UNKNOWN = ["--use-mcore-models", "--ckpt-format", "torch_dist", "--no-rope-fusion=1",
           "--overlap-grad-reduce"]  # Megatron-LM's


def _error_lines(output):
    return [line for line in output.splitlines() if "error" in line.lower()]


def test_unknown_flags_two_ranks_one_line_exit_2(tmp_path):
    """Megatron-LM's flags this trainer does not know, at 2 ranks: one line naming all four (values
    left out), no argparse usage, exit code 2."""
    proc, _ = launch(2, TRAIN + UNKNOWN, str(tmp_path), check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert _error_lines(proc.stdout) == [
        "pretrain_gpt.py: error: unrecognized arguments: --use-mcore-models, --ckpt-format, "
        "--no-rope-fusion, --overlap-grad-reduce (not flags of this trainer: check the spelling, or drop them; "
        "pretrain_gpt.py --help lists the flags it takes)"], proc.stdout[-3000:]
    assert "usage:" not in proc.stdout and "Traceback" not in proc.stdout


def test_refusal_after_torch_distributed_two_ranks_one_line(tmp_path):
    """A refusal raised on both ranks once torch.distributed exists (the tokenizer's 8192 tokens
    against --pad-vocab-size-to, known only when the tokenizer is built): one line, exit code 2."""
    flags = [f for f in TRAIN if f not in ("--vocab-size", "600")]
    flags += ["--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
              "--pad-vocab-size-to", "4096"]
    proc, _ = launch(2, flags, str(tmp_path), check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    lines = _error_lines(proc.stdout)
    assert len(lines) == 1 and lines[0].startswith("pretrain_gpt.py: error: --pad-vocab-size-to 4096 is below "
                                                   "the tokenizer's 8192 tokens"), lines


def _refusing_rank(rank, wait_s):
    code = ("import sys; from megatron.runtime.refusal import exit_refused; "
            f"exit_refused('pretrain_gpt.py', 'the message', wait_s={wait_s})")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, RANK=str(rank), PYTHONPATH=ROOT))


def _catches_sigterm(pid):
    """The process has installed its own SIGTERM handler (bit 15 of /proc's caught-signal mask)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def test_other_ranks_stopped_by_the_launcher_exit_2_silently():
    """Rank 1 waits for the launcher to stop it (rank 0 prints); the launcher's SIGTERM ends it with
    the same code 2 and nothing printed."""
    proc = _refusing_rank(1, wait_s=120)
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (2, "", "")


def test_a_rank_whose_rank_0_never_fails_prints_the_line_itself():
    """An error only rank 3 hits (rank 0 does not stop the job): after the wait rank 3 prints it."""
    proc = _refusing_rank(3, wait_s=0.5)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (2, "", "pretrain_gpt.py: error: the message\n")
    rank_0 = _refusing_rank(0, wait_s=120)  # rank 0 prints at once (a wait would time out below)
    assert rank_0.communicate(timeout=60) == ("", "pretrain_gpt.py: error: the message\n")
    assert rank_0.returncode == 2
