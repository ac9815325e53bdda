"""Tokens, samples, gigaflos, FLOPs and the learning rate where two features that each change them
meet (issue 40): a sequence-length curriculum (C), --skip-train-iteration-range (K),
--rampup-batch-size (R), token schedules (T: --train-tokens, --lr-warmup-tokens / --lr-decay-tokens)
and a resume (Z). Every value is worked out here by hand from per-iteration tables of global batch
and trained length; the runs are the real Trainer (pretrain_gpt.main) on one gloo rank, all of them
in one forked worker (a run takes well under a second there).

  pair  where                                                    (already elsewhere)
  C-K   test_curriculum_with_a_skipped_range_and_a_token_lr
  C-R   test_curriculum_during_ramp_up
  C-T   test_curriculum_with_a_skipped_range_and_a_token_lr (LR), test_train_tokens_with_a_curriculum (stop)
  C-Z   test_all_five_and_a_resume                               (test_curriculum's launch)
  K-R   test_all_five_and_a_resume                               (test_skip_range_accounting)
  K-T   test_curriculum_with_a_skipped_range_and_a_token_lr (LR), test_train_tokens_with_a_skipped_range (stop)
  K-Z   test_all_five_and_a_resume                               (test_skip_range_accounting: samples only)
  R-T   test_train_tokens_and_token_lr_during_ramp_up
  R-Z   test_all_five_and_a_resume
  T-Z   test_all_five_and_a_resume
No pair of the five is refused; what ramp-up refuses (an iteration-based run) is
test_ramp_up_needs_a_sample_based_run."""
import contextlib
import io
import json

import pytest

from megatron.runtime.refusal import ConfigError
from tests.support.distributed import run_distributed
from tests.support.launch import logged_iterations
from tests.support.launcher import TINY
from tests.support.validated_args import validated

SEQ, H, LAYERS, PADDED_VOCAB, LR = 32, 64, 2, 640, 3e-3
N_NO_EMBEDDING = LAYERS * (12 * H * H + 13 * H) + 2 * H  # 100,096: the 6 N D of gigaflos
# TINY without its --lr-warmup-iters (the sample- and token-based runs below refuse it)
BASE = TINY[:TINY.index("--lr-warmup-iters")] + TINY[TINY.index("--lr-warmup-iters") + 2:] + [
    "--eval-iters", "0", "--lr-decay-style", "linear", "--min-lr", "0"]
# the ds_config's curriculum: 8 + 24 x i / 6 tokens at iteration i, down to a multiple of 8
CURRICULUM = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
              "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}
SEQLENS = [8, 16, 16, 24, 24, 32, 32, 32, 32, 32]  # iterations 1..10
# --rampup-batch-size 2 2 8 to --global-batch-size 4: one increment after 8 samples
RAMP = ["--rampup-batch-size", "2", "2", "8"]
RAMP_BATCHES = [2, 2, 2, 2, 4, 4, 4, 4, 4, 4]  # consumed before: 0, 2, 4, 6 (< 8: 2), then 8, 12, ... (4)


def by_hand_flops(s):
    """Forward + backward (3 x forward) per sample at length s, no recompute: per layer QKV 6sh^2,
    scores and context 4s^2h, projection 2sh^2, MLP 16sh^2; logits 2shV."""
    return 3 * (LAYERS * (24 * s * H * H + 4 * s * s * H) + 2 * s * H * PADDED_VOCAB)


def gigaflos(tokens):
    return 6 * tokens * N_NO_EMBEDDING / 1e9


def token_lr(tokens, warmup, decay):
    """Linear warm-up to LR over `warmup` tokens, then linear decay to 0 at `decay` tokens."""
    if tokens <= warmup:
        return LR * tokens / warmup
    return LR * (1 - (tokens - warmup) / (decay - warmup))


def cumulative(values):
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out


class _Recorder:
    """The Trainer's hooks: per trained iteration, the batch and length it trained and the
    progress and LR after it; the run's length as the Trainer computed it."""

    def __init__(self):
        self.steps, self.total = {}, None

    def hooks(self):
        from megatron.training import TrainerHooks
        recorder = self

        class Hooks(TrainerHooks):
            def on_build(self, trainer):
                recorder.total = trainer.total_iterations

            def on_step_start(self, trainer):
                recorder.gbs = trainer.calculator.get_current_global_batch_size()

            def on_step_end(self, trainer, loss):
                p = trainer.progress
                recorder.steps[p.iteration] = dict(
                    gbs=recorder.gbs, seqlen=trainer.seqlen, samples=p.consumed_train_samples,
                    tokens=p.consumed_train_tokens, gigaflos=p.gigaflos_no_embeds,
                    lr=trainer.lr_scheduler.get_lr(), loss=float(loss))
        return Hooks()


def _runs(runs):
    """Each (name, argv) through pretrain_gpt.main in this process: {name: (records, total
    iterations, final progress, stdout)}."""
    import pretrain_gpt
    results = {}
    for name, argv in runs:
        recorder, out = _Recorder(), io.StringIO()
        with contextlib.redirect_stdout(out):
            _, progress = pretrain_gpt.main([str(a) for a in argv], hooks=recorder.hooks())
        results[name] = (recorder.steps, recorder.total, progress.state_dict(), out.getvalue())
    return results


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pairs")
    ds = tmp / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "curriculum_learning": CURRICULUM}))
    curriculum = ["--deepspeed_config", ds]
    save = tmp / "ckpt"
    # C + K + R + T, resumed (Z): skipped 2 and 6, stop at 600 tokens, token LR
    all_five = BASE + curriculum + RAMP + [
        "--global-batch-size", 4, "--train-samples", 1000, "--train-tokens", 600, "--skip-train-iteration-range",
        "2-2", "6-6", "--lr-warmup-tokens", 64, "--lr-decay-tokens", 1000]
    plan = [
        ("C+K+T", BASE + curriculum + [
            "--global-batch-size", 4, "--train-iters", 8, "--skip-train-iteration-range", "3-4",
            "--lr-warmup-tokens", 40, "--lr-decay-tokens", 1000, "--log-interval", 2,
            "--tensorboard-dir", tmp / "tb_ckt", "--log-timers-to-tensorboard", "--peak-tflops", 1]),
        ("C+R", BASE + curriculum + RAMP + [
            "--global-batch-size", 4, "--train-samples", 24, "--tensorboard-dir", tmp / "tb_cr",
            "--log-timers-to-tensorboard"]),
        ("C+T", BASE + curriculum + ["--global-batch-size", 4, "--train-iters", 100, "--train-tokens", 384]),
        ("K+T", BASE + ["--global-batch-size", 4, "--train-iters", 100, "--train-tokens", 640,
                        "--skip-train-iteration-range", "2-3"]),
        ("R+T", BASE + RAMP + ["--global-batch-size", 4, "--train-samples", 1000, "--train-tokens", 500,
                               "--lr-warmup-tokens", 64, "--lr-decay-tokens", 640]),
        ("whole", all_five),
        ("stopped", all_five + ["--save", save, "--save-interval", 3, "--exit-interval", 3]),
        ("resumed", all_five + ["--load", save]),
    ]
    [results] = run_distributed(1, _runs, plan)
    return results, tmp


def check_steps(steps, trained, table):
    """`table`: {iteration: (global batch, length)} of every iteration, skipped ones included;
    `trained`: the iterations that trained. The progress after each trained iteration by hand."""
    assert sorted(steps) == trained
    for it in trained:
        consumed = [table[i] for i in range(1, it + 1)]
        done = [table[i] for i in range(1, it + 1) if i in trained]
        step = steps[it]
        assert (step["gbs"], step["seqlen"]) == table[it], it
        assert step["samples"] == sum(b for b, _ in consumed), it
        assert step["tokens"] == sum(b * s for b, s in consumed), it
        assert step["gigaflos"] == pytest.approx(gigaflos(sum(b * s for b, s in done)), rel=1e-12), it


def test_curriculum_with_a_skipped_range_and_a_token_lr(runs):
    """Iterations 3-4 skipped at lengths 16 and 24: their tokens are consumed (at the curriculum's
    length of that iteration) but neither trained (gigaflos) nor scheduled (the token LR); the
    log every 2 iterations averages the trained ones only: the line at 6 covers 5 and 6."""
    results, tmp = runs
    steps, total, progress, out = results["C+K+T"]
    table = {i: (4, SEQLENS[i - 1]) for i in range(1, 9)}
    check_steps(steps, [1, 2, 5, 6, 7, 8], table)
    # tokens trained after 1, 2, 5, 6, 7, 8: 32, 96, 96 + 96, 320, 448, 576
    for it, trained_tokens in zip([1, 2, 5, 6, 7, 8], [32, 96, 192, 320, 448, 576], strict=True):
        assert steps[it]["lr"] == pytest.approx(token_lr(trained_tokens, 40, 1000), rel=1e-12), it
    assert (total, progress["iteration"], progress["consumed_train_tokens"]) == (8, 8, 4 * sum(SEQLENS[:8]))
    logged = logged_iterations(out)
    assert sorted(logged) == [2, 6, 8]
    # 4 x (8 + 16), 4 x (8 + 16 + 16 + 24 + 24 + 32), + 4 x (32 + 32): skipped ones' tokens included
    assert [logged[i]["consumed tokens"] for i in (2, 6, 8)] == [96, 480, 736]
    s = _scalars(tmp / "tb_ckt")
    # the interval's tokens and FLOPs: iteration-time is the interval's time over its trained iterations
    for it, lengths in ((2, [8, 16]), (6, [24, 32]), (8, [32, 32])):
        elapsed = s["iteration-time/iteration-time"][it] * 2
        assert s["iteration-time/tokens per second"][it] * elapsed == pytest.approx(4 * sum(lengths), rel=1e-5)
        flops = sum(4 * by_hand_flops(n) for n in lengths)
        assert s["iteration-time/TFLOPs per gpu (estimated)"][it] * elapsed * 1e12 == pytest.approx(flops, rel=1e-5)
        assert s["iteration-time/MFU"][it] * elapsed * 1e12 == pytest.approx(flops, rel=1e-5)  # a 1 TFLOP/s peak


def test_curriculum_during_ramp_up(runs):
    """Batches 2, 2, 2, 2, then 4 while the length grows 8 -> 32: each iteration's tokens and
    FLOPs are its batch x its length; --train-samples 24 is the 8 iterations."""
    results, tmp = runs
    steps, total, progress, _ = results["C+R"]
    table = {i: (RAMP_BATCHES[i - 1], SEQLENS[i - 1]) for i in range(1, 9)}
    check_steps(steps, list(range(1, 9)), table)
    # samples 24: the LR decays linearly to 0 over them (no warm-up)
    for it in range(1, 9):
        assert steps[it]["lr"] == pytest.approx(LR * (1 - sum(RAMP_BATCHES[:it]) / 24), rel=1e-12, abs=1e-18), it
    assert (total, progress["consumed_train_samples"], progress["consumed_train_tokens"]) == (
        8, 24, 16 + 32 + 32 + 48 + 96 + 128 * 3)
    s = _scalars(tmp / "tb_cr")
    for it in range(1, 9):
        b, n = table[it]
        elapsed = s["iteration-time/iteration-time"][it]
        assert s["iteration-time/tokens per second"][it] * elapsed == pytest.approx(b * n, rel=1e-5), it
        assert s["iteration-time/TFLOPs per gpu (estimated)"][it] * elapsed * 1e12 == pytest.approx(
            b * by_hand_flops(n), rel=1e-5), it


def test_train_tokens_with_a_curriculum(runs):
    """--train-tokens 384 (3 iterations of 4 x 32 tokens) while the length warms up: the run trains
    until 384 tokens are consumed, 4 x (8 + 16 + 16 + 24 + 24 + 32) = 480 after iteration 6; its
    data split holds the 24 samples that takes and the log line counts 6 iterations."""
    results, _ = runs
    steps, total, progress, out = results["C+T"]
    check_steps(steps, list(range(1, 7)), {i: (4, SEQLENS[i - 1]) for i in range(1, 7)})
    assert (total, progress["iteration"], progress["consumed_train_tokens"]) == (6, 6, 480)
    assert " iteration        6/       6 |" in out


def test_train_tokens_with_a_skipped_range(runs):
    """--train-tokens 640 = 5 iterations of 4 x 32; 2-3 skipped still consume theirs: the run
    stops after iteration 5 having trained 1, 4 and 5."""
    results, _ = runs
    steps, total, progress, _ = results["K+T"]
    check_steps(steps, [1, 4, 5], {i: (4, SEQ) for i in range(1, 6)})
    assert (total, progress["iteration"], progress["consumed_train_tokens"]) == (5, 5, 640)


def test_train_tokens_and_token_lr_during_ramp_up(runs):
    """Batches 2, 2, 2, 2, 4, 4 of 32 tokens: 64, 128, 192, 256, 384, 512 tokens; --train-tokens
    500 stops after iteration 6; the LR warms up over 64 tokens and decays to 0 at 640."""
    results, _ = runs
    steps, total, progress, _ = results["R+T"]
    check_steps(steps, list(range(1, 7)), {i: (RAMP_BATCHES[i - 1], SEQ) for i in range(1, 7)})
    for it, tokens in zip(range(1, 7), [64, 128, 192, 256, 384, 512], strict=True):
        assert steps[it]["lr"] == pytest.approx(token_lr(tokens, 64, 640), rel=1e-12), it
    assert (total, progress["consumed_train_samples"], progress["consumed_train_tokens"]) == (6, 16, 512)


# the five together: batch and length of iterations 1..8; 2 and 6 skipped
ALL_FIVE = {i: (RAMP_BATCHES[i - 1], SEQLENS[i - 1]) for i in range(1, 9)}
ALL_FIVE_TRAINED = [1, 3, 4, 5, 7, 8]


def test_all_five_and_a_resume(runs):
    """Curriculum, ramp-up, skipped iterations 2 and 6, --train-tokens 600 and a token LR: tokens
    16, 48, 80, 128, 224, 352, 480, 608, so the run ends after iteration 8 (its data split sized for
    the 24 samples that takes, though 600 tokens at full length would be 19). Stopped and saved
    after iteration 3 (mid-ramp-up, mid-warm-up, after a skipped iteration) and resumed: iterations
    4-8 are the uninterrupted run's, skipped 6 included, to the last bit of the loss and LR."""
    results, _ = runs
    steps, total, progress, _ = results["whole"]
    check_steps(steps, ALL_FIVE_TRAINED, ALL_FIVE)
    trained_tokens = cumulative(b * s for i, (b, s) in ALL_FIVE.items() if i in ALL_FIVE_TRAINED)
    assert trained_tokens == [16, 48, 96, 192, 320, 448]
    for it, tokens in zip(ALL_FIVE_TRAINED, trained_tokens, strict=True):
        assert steps[it]["lr"] == pytest.approx(token_lr(tokens, 64, 1000), rel=1e-12), it
    assert (total, progress["consumed_train_samples"], progress["consumed_train_tokens"]) == (8, 24, 608)

    stopped_steps, _, stopped, out = results["stopped"]
    assert sorted(stopped_steps) == [1, 3] and "exiting program at iteration 3" in out
    assert stopped["iteration"] == 3
    resumed_steps, resumed_total, resumed, out = results["resumed"]
    assert "skipping iterations 6 to 6 (--skip-train-iteration-range)" in out.splitlines()
    assert resumed_total == 8 and sorted(resumed_steps) == [4, 5, 7, 8]
    for it in (4, 5, 7, 8):
        assert resumed_steps[it] == steps[it], it
    assert resumed == progress


def test_ramp_up_needs_a_sample_based_run():
    """The one combination refused: ramp-up with --train-iters (also beside --train-tokens)."""
    for extra in ([], ["--train-tokens", "1000"]):
        with pytest.raises(ConfigError, match="^--rampup-batch-size needs --train-samples "
                                              r"\(sample-based training\)$"):
            validated([*RAMP, *extra])
