"""Token accounting across --skip-train-iteration-range (megatron/schedules/skip_iterations.py), worked by
hand: a skipped iteration reads its batch, so consumed samples and tokens advance by its global
batch; it computes nothing, so gigaflos (6 N D over trained samples) and the LR schedule do not.
The batch ramps up meanwhile, so each skipped iteration's batch differs from its neighbours'.
A save or exit interval that falls inside a skipped range still saves and stops there."""
import contextlib
import io

import pytest

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY

SEQ, N_NO_EMBEDDING = 32, 100_096  # TINY: h 64, 2 layers: 2 (12 h^2 + 13 h) + 2 h
LR, ITERS = 3e-3, 8
# --rampup-batch-size 2 2 16 to --global-batch-size 8: 3 steps of 16 / 3 samples; the batch is
# 2 + 2 x int(consumed / (16 / 3)) until 16 samples are consumed, then 8. Consumed before each
# iteration: 0, 2, 4, 6, 10, 14, 20, 28 -> batches 2, 2, 2, 4, 4, 6, 8, 8 (36 samples in all)
BATCHES = {1: 2, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 8, 8: 8}
SKIPPED = {3, 4, 7}
# sample-based (as --rampup-batch-size requires): 36 samples are the 8 iterations above
BASE = TINY[:TINY.index("--lr-warmup-iters")] + TINY[TINY.index("--lr-warmup-iters") + 2:]
ARGV = BASE + ["--global-batch-size", "8", "--rampup-batch-size", "2", "2", "16", "--train-samples", "36",
               "--lr-warmup-samples", "8", "--eval-iters", "0", "--lr-decay-style", "linear", "--min-lr", "0",
               "--skip-train-iteration-range", "7-7", "3-4"]


def _run(argv):
    import pretrain_gpt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _, progress = pretrain_gpt.main([str(a) for a in argv])
    return progress.state_dict(), out.getvalue()


def lr_after(trained_samples):
    """Warmup over 8 samples, then linear decay to 0 at --train-samples 36."""
    warmup, decay = 8, 36
    if trained_samples <= warmup:
        return LR * trained_samples / warmup
    return LR * (1 - (trained_samples - warmup) / (decay - warmup))


def test_skipped_iterations_consume_samples_and_tokens_but_no_compute():
    from tests.support.launch import logged_iterations
    [(progress, out)] = run_distributed(1, _run, ARGV)
    assert "skipping iterations 3 to 4 (--skip-train-iteration-range)" in out.splitlines()
    assert "skipping iterations 7 to 7 (--skip-train-iteration-range)" in out.splitlines()
    consumed = sum(BATCHES.values())
    trained = sum(b for it, b in BATCHES.items() if it not in SKIPPED)
    assert (consumed, trained) == (36, 22)
    assert progress["iteration"] == ITERS
    assert progress["consumed_train_samples"] == 36
    assert progress["consumed_train_tokens"] == 36 * SEQ
    assert progress["gigaflos_no_embeds"] == pytest.approx(6 * 22 * SEQ * N_NO_EMBEDDING / 1e9, rel=1e-12)
    assert progress["skipped_iterations"] == 0  # that counter is fp16's overflow steps, not the range
    # the log lines of the trained iterations: consumed counts include the skipped batches, the
    # learning rate only the trained ones
    logged = logged_iterations(out)
    assert sorted(logged) == [1, 2, 5, 6, 8]
    samples = trained_samples = 0
    for it in range(1, ITERS + 1):
        samples += BATCHES[it]
        if it in SKIPPED:
            continue
        trained_samples += BATCHES[it]
        line = logged[it]
        assert (line["consumed samples"], line["consumed tokens"]) == (samples, samples * SEQ), it
        assert line["global batch size"] == BATCHES[it], it
        assert f"{line['learning rate']:.3E}" == f"{lr_after(trained_samples):.3E}", it


def test_a_save_and_an_exit_inside_a_skipped_range_take_effect(tmp_path):
    """--save-interval 2 and --exit-interval 4 with iterations 3-4 skipped (global batch 4, 8
    iterations): the run saves at 2 and at the skipped 4 and stops after iteration 4, not at the
    end; the checkpoint of iteration 4 has read 4 x 4 samples. Resumed from it, the run skips
    nothing more and trains iterations 5 to 8."""
    from tests.support.launch import logged_iterations
    save = str(tmp_path / "ckpt")
    run = TINY + ["--global-batch-size", "4", "--train-iters", "8", "--eval-iters", "0", "--save", save,
                  "--save-interval", "2", "--skip-train-iteration-range", "3-4"]
    [(progress, out)] = run_distributed(1, _run, run + ["--exit-interval", "4"])
    assert "exiting program at iteration 4" in out.splitlines()
    assert sorted(logged_iterations(out)) == [1, 2]
    assert (progress["iteration"], progress["consumed_train_samples"]) == (4, 16)
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("global_step*")) == ["global_step2", "global_step4"]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    [(progress, out)] = run_distributed(1, _run, run + ["--load", save])
    assert not any(line.startswith("skipping iterations") for line in out.splitlines())
    assert sorted(logged_iterations(out)) == [5, 6, 7, 8]
    assert (progress["iteration"], progress["consumed_train_samples"]) == (8, 32)
