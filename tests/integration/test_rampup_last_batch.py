"""A run whose last iteration reads past --train-samples (a ramp-up's batch sizes) gets a training
split that holds what that iteration reads, for every dataset kind; before, the split held exactly
--train-samples and the last iteration died in DeepSpeed's loader with StopIteration.

By hand, `--rampup-batch-size 2 2 4 --global-batch-size 4 --train-samples 10`: one step of +2
after 4 ramp-up samples, so the batches are 2 (0 consumed), 2 (2), then 4 (4 >= 4) and 4 (8 < 10):
4 iterations reading 2 + 2 + 4 + 4 = 12 samples."""
import pytest

import pretrain_gpt
from megatron.config.arguments import parse_args
from megatron.config.validation import validate_args
from megatron.schedules.microbatches import train_samples
from tests.support.launcher import TINY, launch

RAMPUP = ["--rampup-batch-size", "2", "2", "4", "--global-batch-size", "4", "--train-samples", "10"]
READ = 12  # the hand count above


def _sample_based(flags):
    i = flags.index("--lr-warmup-iters")
    return flags[:i] + flags[i + 2:]  # a sample-based run takes no iteration warmup


def test_the_issues_run_trains_its_four_iterations_at_pp2(tmp_path):
    proc, ranks = launch(2, _sample_based(TINY) + RAMPUP + ["--pipeline-model-parallel-size", "2"], str(tmp_path))
    assert "StopIteration" not in proc.stdout
    assert " iteration        4/       4 | consumed samples:           12 |" in proc.stdout
    assert ranks[1]["iteration"] == 4
    # torch's warning about DeepSpeed's tied-embedding broadcast, harmless (tests/integration/test_pipeline.py), is
    # filtered: no rank prints it
    assert "c10d::broadcast_" not in proc.stdout


def _args(data_flags):
    model = [f for f in _sample_based(TINY) if f not in ("--mock-data", "--vocab-size", "600")]
    return validate_args(parse_args(args_list=model + RAMPUP + data_flags + [
        "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt"]),
        world_size=1, cuda_available=False)


@pytest.mark.parametrize("kind", ["indexed", "blend", "weighted split paths"])
def test_every_dataset_kind_holds_what_the_last_iteration_reads(kind, corpus):
    data = {"indexed": ["--data-path", corpus, "--split", "1,0,0"],
            "blend": ["--data-path", "0.3", corpus, "0.7", corpus, "--split", "1,0,0"],
            "weighted split paths": ["--train-weighted-split-paths", f"TRAIN: 0.3 0:0.5 {corpus}, 0.7 0.5:1 {corpus}"]}
    args = _args(data[kind])
    assert train_samples(args) == READ
    train = pretrain_gpt.train_valid_test_datasets_provider(args, [train_samples(args), 0, 0])[0]
    # a blend holds exactly the samples asked for; a single prefix whole epochs, at least as many
    assert len(train) == READ if kind != "indexed" else len(train) >= READ
    assert len(train[READ - 1]["text"]) == args.seq_length + 1  # the last sample read is there
