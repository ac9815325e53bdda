"""One BLOOM/Microsoft-style run, checked against runs that never take the paths under test:

* a token-based LR schedule and length (--train-tokens, --lr-warmup-tokens, --lr-decay-tokens): every
  logged iteration's LR equals the formula written out below, across a resume;
* BigScience's weighted split paths (one training group blending two datasets over document ranges,
  two validation groups, one test group): the samples drawn come from each dataset in the blend's
  proportions and only from the ranges given; each validation group is evaluated and logged on its
  own, and its loss equals an evaluation that reads the same data through --data-path;
* --kill-switch-path: the file appears after iteration 5 (rank 0 alone creates it), every rank saves
  and the launch exits 0; the resumed run's losses equal an uninterrupted run's.

The killed run is a real `deepspeed` launch (its exit code); the resume and the reference runs are
whole `pretrain_gpt.main` runs one after the other on one pair of gloo processes (PP=2)."""
import math
import os

import numpy as np
import pytest

from tests.support.distributed import run_distributed
from tests.support.launcher import launch

SEQ, GBS, TOKENS_PER_ITER = 16, 4, 16 * 4
TRAIN_TOKENS, WARMUP_TOKENS, DECAY_TOKENS = 500, 150, 400
LR, MIN_LR = 3e-3, 1e-4
ITERS = math.ceil(TRAIN_TOKENS / TOKENS_PER_ITER)  # 8: the run stops once 500 tokens are consumed
KILL_AT = 5
DOCS, B_OFFSET = 40, 100  # dataset A: document d is the token d repeated; B: the token 100 + d
WEIGHTS = (0.3, 0.7)


def _write_dataset(prefix, offset):
    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for d in range(DOCS):
        builder.add_item(np.full(10 + (7 * d) % 23, offset + d))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def _base(tmp, data):
    return ["--num-layers", 2, "--hidden-size", 32, "--num-attention-heads", 4, "--seq-length", SEQ,
            "--max-position-embeddings", SEQ, "--micro-batch-size", 2, "--global-batch-size", GBS,
            "--pipeline-model-parallel-size", 2, "--tokenizer-type", "NullTokenizer", "--vocab-size", 256,
            "--hidden-dropout", 0, "--attention-dropout", 0, "--seed", 1234, "--log-interval", 1,
            "--eval-interval", 4, "--eval-iters", 1, "--save-interval", 4,
            # Microsoft's scripts pass a large --train-iters next to --train-tokens: tokens end the run
            "--train-iters", 1000, "--train-tokens", TRAIN_TOKENS, "--lr", LR, "--min-lr", MIN_LR,
            "--lr-decay-style", "cosine", "--lr-warmup-tokens", WARMUP_TOKENS, "--lr-decay-tokens", DECAY_TOKENS,
            ] + data


def _split_paths(tmp, a, b):
    groups = tmp / "valid_groups.txt"  # BigScience's file form: one line, each group quoted
    groups.write_text(f'"VALID_A: 1 0.8:1 {a}" "VALID_MIX: 0.3 0.8:1 {a}, 0.7 0.8:1 {b}"\n')
    return ["--train-weighted-split-paths", f"TRAIN: 0.3 0:0.8 {a}, 0.7 0:0.8 {b}",
            "--valid-weighted-split-paths-path", groups, "--test-weighted-split-paths", f"TEST_B: 1 0.8:1 {b}"]


def expected_lr(tokens):
    """Linear warmup over 150 tokens, then cosine from LR to MIN_LR until 400 tokens, MIN_LR after."""
    if tokens <= WARMUP_TOKENS:
        return LR * tokens / WARMUP_TOKENS
    if tokens > DECAY_TOKENS:
        return MIN_LR
    progress = (tokens - WARMUP_TOKENS) / (DECAY_TOKENS - WARMUP_TOKENS)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def _runs(runs):
    """Each (name, argv, kill switch path): pretrain_gpt.main in this process; what the driver saw."""
    os.environ["DRIVER_RECORD_BATCHES"] = "1"
    from tests.support import pretrain_driver
    out = {}
    for name, argv in runs:
        for key in ("losses", "lrs", "tokens"):
            pretrain_driver.state[key] = {}
        pretrain_driver.state["samples"], pretrain_driver.state["evaluations"] = [], []
        _, progress = pretrain_driver.run([str(a) for a in argv])
        out[name] = {key: pretrain_driver.state[key] for key in ("losses", "lrs", "tokens", "samples", "evaluations")}
        out[name]["iteration"] = progress.iteration
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("groups")
    a, b = str(tmp / "a_text_document"), str(tmp / "b_text_document")
    _write_dataset(a, 0)
    _write_dataset(b, B_OFFSET)
    ckpt, kill = tmp / "ckpt", tmp / "KILL"
    split_paths = _base(tmp, _split_paths(tmp, a, b))
    os.environ["DRIVER_KILL_SWITCH_AT"], os.environ["DRIVER_RECORD_BATCHES"] = str(KILL_AT), "1"
    try:
        killed, ranks = launch(2, split_paths + ["--save", ckpt, "--kill-switch-path", kill], str(tmp / "killed"))
    finally:
        del os.environ["DRIVER_KILL_SWITCH_AT"], os.environ["DRIVER_RECORD_BATCHES"]
    kill_file_was_there = kill.exists()
    later = run_distributed(2, _runs, [
        # the switch still there: the job ends at startup, before training
        ("startup", split_paths + ["--load", ckpt, "--kill-switch-path", kill]),
        ("resumed", split_paths + ["--load", ckpt, "--save", ckpt, "--kill-switch-path", tmp / "not_there",
                                   "--tensorboard-dir", tmp / "tb", "--log-validation-ppl-to-tensorboard"]),
        # the same training data through --data-path: A and B with the train range as --split's share
        ("uninterrupted", _base(tmp, ["--data-path", WEIGHTS[0], a, WEIGHTS[1], b, "--split", "80,20,0"])),
        # the final model, evaluated on dataset A's last 20% alone (a reload of a finished run)
        ("a_alone", _base(tmp, ["--data-path", a, "--split", "80,20,0", "--load", ckpt])),
    ], pp=2)
    return dict(killed=killed, ranks=ranks, later=later, ckpt=ckpt, tmp=tmp, a=a, b=b,
                kill_file_was_there=kill_file_was_there)


def test_kill_switch_saves_on_every_rank_and_exits_cleanly(runs):
    killed, last = runs["killed"], runs["ranks"][1]  # the last stage logs the loss
    assert killed.returncode == 0 and runs["kill_file_was_there"]
    assert sorted(map(int, last["losses"])) == list(range(1, KILL_AT + 1))
    assert f"Detected kill switch at {runs['tmp'] / 'KILL'}. Exiting" in killed.stdout
    saved = os.listdir(runs["ckpt"] / f"global_step{KILL_AT}")
    # both pipeline ranks wrote their shards: the embedding + layer 1 (stage 0), layer 2 + head (stage 1)
    assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt", "layer_00-model_00-model_states.pt",
            "layer_03-model_00-model_states.pt"} <= set(saved)
    # a switch still present when a job starts ends it before anything is trained or saved
    startup = runs["later"][1]["startup"]
    assert startup["iteration"] == 0 and startup["losses"] == {}


def test_resume_continues_the_uninterrupted_run_exactly(runs):
    killed, resumed = runs["ranks"][1], runs["later"][1]["resumed"]
    uninterrupted = runs["later"][1]["uninterrupted"]
    assert sorted(resumed["losses"]) == list(range(KILL_AT + 1, ITERS + 1))
    losses = {**{int(k): v for k, v in killed["losses"].items()}, **resumed["losses"]}
    assert losses == uninterrupted["losses"]  # same samples, same order, same updates
    assert sorted(uninterrupted["losses"]) == list(range(1, ITERS + 1))


def test_token_schedule_gives_the_formula_lr_at_every_logged_iteration(runs):
    killed, resumed = runs["ranks"][1], runs["later"][1]["resumed"]
    logged = {**{int(k): v for k, v in killed["lrs"].items()}, **resumed["lrs"]}
    tokens = {**{int(k): v for k, v in killed["tokens"].items()}, **resumed["tokens"]}
    assert tokens == {k: k * TOKENS_PER_ITER for k in range(1, ITERS + 1)}
    for k, lr in logged.items():
        assert lr == pytest.approx(expected_lr(k * TOKENS_PER_ITER), rel=1e-12, abs=0), k
    # all three phases happen: warmup (1, 2), decay (3..6), the floor (7, 8)
    assert logged[2] < LR and logged[3] < LR and logged[ITERS] == MIN_LR
    assert f" consumed tokens: {KILL_AT * TOKENS_PER_ITER:12d} |" in runs["killed"].stdout


def _dataset_of(sample):
    """'A' or 'B' and the documents a sample was cut from (its token ids name them)."""
    names = {"A" if t < B_OFFSET else "B" for t in sample}
    assert len(names) == 1, sample  # a sample never mixes datasets
    name = names.pop()
    return name, {t - (B_OFFSET if name == "B" else 0) for t in sample}


def test_samples_come_from_each_dataset_in_its_share_and_range(runs):
    train_docs, held_out = set(range(int(0.8 * DOCS))), set(range(int(0.8 * DOCS), DOCS))
    first_stage = runs["ranks"][0]["samples"] + runs["later"][0]["resumed"]["samples"]
    train = [s for s in first_stage if max(s) % B_OFFSET < int(0.8 * DOCS)]
    assert len(train) == ITERS * GBS  # every training sample, each read once
    counts = {"A": 0, "B": 0}
    for sample in train:
        name, docs = _dataset_of(sample)
        assert docs <= train_docs, docs
        counts[name] += 1
    # 32 samples x 0.3 = 9.6 and x 0.7 = 22.4: each share rounded to the nearest sample
    assert (counts["A"], counts["B"]) == (10, 22)
    for sample in first_stage:
        if sample not in train:
            assert _dataset_of(sample)[1] <= held_out
    # each dataset's training index was asked for its share plus Megatron's 0.5%:
    # ceil(32 x 0.3 x 1.005) = 10 and ceil(32 x 0.7 x 1.005) = 23 samples
    for prefix, n in ((runs["a"], 10), (runs["b"], 23)):
        assert any(f.startswith(os.path.basename(prefix) + f"_train_indexmap_{n}ns_{SEQ}sl_")
                   for f in os.listdir(runs["tmp"])), (prefix, n)


def test_each_validation_group_is_evaluated_alone_and_matches_data_path(runs):
    later = runs["later"][1]
    groups = [[p, n, loss] for p, n, loss in runs["ranks"][1]["evaluations"]] + later["resumed"]["evaluations"]
    by_group = {}
    for prefix, name, loss in groups:
        by_group.setdefault(name, []).append((prefix, loss))
    assert [p for p, _ in by_group["VALID_A"]] == ["iteration 4", "iteration 8", "the end of training for val data"]
    assert [p for p, _ in by_group["VALID_MIX"]] == [p for p, _ in by_group["VALID_A"]]
    assert [p for p, _ in by_group["TEST_B"]] == ["the end of training for test data"]
    assert None not in by_group  # no unnamed validation
    # the blend of A's and B's held-out documents, read through --data-path by the uninterrupted run
    reference = [(p, loss) for p, name, loss in later["uninterrupted"]["evaluations"] if p != "the end of training "
                 "for test data"]
    assert by_group["VALID_MIX"] == reference
    # A's held-out documents alone, read through --data-path by a reload of the final checkpoint
    [(prefix, name, loss)] = later["a_alone"]["evaluations"]
    assert (prefix, name) == ("the end of training for val data", None)
    assert by_group["VALID_A"][-1][1] == loss
    assert by_group["VALID_A"][0][1] != by_group["VALID_MIX"][0][1]

    assert " VALID_A loss at iteration 4 | lm loss value: " in runs["killed"].stdout
    assert " VALID_MIX loss at iteration 4 | lm loss value: " in runs["killed"].stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(runs["tmp"] / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for group in ("VALID_A", "VALID_MIX"):
        for suffix in ("", " vs samples", " vs tokens", " vs gigaflos (without embeddings)"):
            assert f"lm-loss-validation/{group}/lm loss validation{suffix}" in tags
            assert f"lm-loss-validation/{group}/lm loss validation ppl{suffix}" in tags
    end = events.Scalars("lm-loss-validation/VALID_A/lm loss validation vs tokens")[-1]
    assert end.step == ITERS * TOKENS_PER_ITER
    assert end.value == pytest.approx(by_group["VALID_A"][-1][1], rel=1e-6)
