"""Resumed from --load A with --save B (a run moved to a new directory), a run whose schedule is
already done writes its iteration into B, as Megatron saves at the end of training; resumed with
--save A as well, it writes nothing (the iteration is saved there already). One rank, in-process."""
import contextlib
import io

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY

RUN = TINY + ["--global-batch-size", "2", "--train-iters", "2", "--eval-iters", "0"]


def _run(argv):
    import pretrain_gpt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _, progress = pretrain_gpt.main([str(a) for a in argv])
    return progress.iteration, out.getvalue()


def test_a_finished_run_resumed_into_another_save_dir_saves_there(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    [(iteration, _)] = run_distributed(1, _run, RUN + ["--save", a])
    assert iteration == 2 and (a / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    before = sorted(p.name for p in a.iterdir())
    [(iteration, out)] = run_distributed(1, _run, RUN + ["--load", a, "--save", b])
    assert iteration == 2
    assert f"saved checkpoint at iteration 2 to {b}" in out.splitlines()
    assert (b / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (b / "global_step2").is_dir() and sorted(p.name for p in a.iterdir()) == before
    # the same directory: nothing to save
    [(_, out)] = run_distributed(1, _run, RUN + ["--load", a, "--save", a])
    assert not any(line.startswith("saved checkpoint") for line in out.splitlines())
