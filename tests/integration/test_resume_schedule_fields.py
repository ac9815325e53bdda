"""The resume check of the learning-rate schedule (megatron/schedules/learning_rates.py, CHECKED: the fields a
checkpoint's schedule must share with the flags, as the forks' _check_and_set does), one field at a
time through real --load runs: each change alone stops the run in one line naming that field with
both values; --override-opt_param-scheduler then trains with the flags' schedule and
--use-checkpoint-opt_param-scheduler with the saved one, at the saved position. The learning rates
are worked out by hand."""
import contextlib
import io
import math

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY

MAX, MIN, SEQ, GBS = 3e-3, 1e-4, 32, 4
# saved: no warmup, linear decay over 10 iterations x 4 = 40 samples; 2 iterations = 8 samples.
# The resumed iteration 3 reaches 12 samples (384 tokens): the LR it logs is the schedule's at 12.
BASE = (TINY[:TINY.index("--lr")] + TINY[TINY.index("--lr-warmup-iters") + 2:]
        + ["--global-batch-size", GBS, "--lr", MAX, "--min-lr", MIN, "--lr-warmup-iters", 0, "--lr-decay-iters", 10,
           "--lr-decay-style", "linear", "--eval-iters", 0])
SAVED_LR = MIN + (1 - 12 / 40) * (MAX - MIN)

# flag changed on resume -> (the error's words, the flags' LR at 12 samples, by hand)
CHANGES = {
    ("--lr", 6e-3): ("learning rate: saved 0.003 vs now 0.006", MIN + (1 - 12 / 40) * (6e-3 - MIN)),
    ("--min-lr", 5e-4): ("minimum learning rate: saved 0.0001 vs now 0.0005", 5e-4 + (1 - 12 / 40) * (MAX - 5e-4)),
    # warmup 1 x 4 samples: 12 is past it, decay from 4 to 40
    ("--lr-warmup-iters", 1): ("warmup samples: saved 0 vs now 4", MIN + (1 - 8 / 36) * (MAX - MIN)),
    ("--lr-decay-iters", 20): ("decay samples: saved 40 vs now 80", MIN + (1 - 12 / 80) * (MAX - MIN)),
    # token lengths: 12 samples x 32 = 384 tokens; 384 of a 512-token warmup
    ("--lr-warmup-tokens", 512): ("warmup tokens: saved None vs now 512", MAX * 384 / 512),
    ("--lr-decay-tokens", 640): ("decay tokens: saved None vs now 640", MIN + (1 - 384 / 640) * (MAX - MIN)),
    ("--lr-decay-style", "cosine"): ("decay style: saved linear vs now cosine",
                                     MIN + (MAX - MIN) * 0.5 * (math.cos(math.pi * 12 / 40) + 1)),
}


def with_flag(argv, flag, value):
    out = [str(a) for a in argv]
    if flag in out:
        out[out.index(flag) + 1] = str(value)
    else:
        out += [flag, str(value)]
    return out


def _main(argv):
    """(exit code, stdout, stderr) of pretrain_gpt.main(argv) in this process."""
    import pretrain_gpt
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            pretrain_gpt.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _runs(save_dir):
    """The saved run, then for each change: refused, flags win, checkpoint wins."""
    code, out, err = _main(with_flag(BASE, "--train-iters", 2) + ["--save", save_dir])
    assert code == 0, err[-3000:]
    resume = with_flag(BASE, "--train-iters", 3) + ["--load", save_dir]
    results = {"unchanged": _main(resume)}
    for flag, value in CHANGES:
        changed = with_flag(resume, flag, value)
        results[flag] = [_main(changed), _main(changed + ["--override-opt_param-scheduler"]),
                         _main(changed + ["--use-checkpoint-opt_param-scheduler"])]
    return results


def logged_lr(run):
    from tests.support.launch import logged_iterations
    code, out, err = run
    assert code == 0, err[-3000:]
    logged = logged_iterations(out)
    assert sorted(logged) == [3]  # resumed at iteration 2
    return f"{logged[3]['learning rate']:.3E}"


def test_every_schedule_field_changed_on_resume(tmp_path):
    [results] = run_distributed(1, _runs, str(tmp_path / "ckpt"))
    assert logged_lr(results["unchanged"]) == f"{SAVED_LR:.3E}"
    for (flag, _), (words, flags_lr) in CHANGES.items():
        refused, flags_win, saved_wins = results[flag]
        code, out, err = refused
        assert code == 2, (flag, err[-2000:])
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "pretrain_gpt.py: error: --load: the checkpoint's learning-rate schedule differs from the flags' ("
            + words + ");"), (flag, lines)
        assert "iteration        3" not in out  # nothing trained
        assert logged_lr(flags_win) == f"{flags_lr:.3E}", flag
        assert logged_lr(saved_wins) == f"{SAVED_LR:.3E}", flag
        assert f"{flags_lr:.3E}" != f"{SAVED_LR:.3E}", flag  # each change moves the LR
