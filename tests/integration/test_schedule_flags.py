"""The rules of the token schedule, weighted-split-path, kill-switch and checkpoint-method flags
(one `pretrain_gpt.py: error:` line naming the flag, before the model is built), and
tools/param_count.py following --activations-checkpoint-method like the trainer."""
import importlib.util
import os

import numpy as np
import pytest

from tests.support.flag_runs import check_one_line, flags

TOKENS = {"--train-tokens": 1000}


def _dataset(tmp_path):
    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
    prefix = str(tmp_path / "d_text_document")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(10):
        builder.add_item(np.arange(40) % 500)
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


RULES = [
    ({**TOKENS, "--lr-warmup-tokens": 10, "--lr-warmup-iters": 2}, "--lr-warmup-tokens"),
    ({"--lr-warmup-tokens": 10, "--lr-warmup-fraction": 0.1}, "--lr-warmup-tokens"),
    ({"--lr-warmup-tokens": 1000, "--lr-decay-tokens": 500}, "--lr-warmup-tokens"),
    # decay by iterations: 10 x 8 x 32 = 2560 tokens
    ({"--lr-warmup-tokens": 2560}, "--lr-warmup-tokens"),
    ({"--override-opt_param-scheduler": None, "--use-checkpoint-lr-scheduler": None}, "--override-opt_param-scheduler"),
    ({"--activations-checkpoint-num-layers": 2}, "--activations-checkpoint-method"),
    ({"--activations-checkpoint-method": "block", "--activations-checkpoint-num-layers": 2,
      "--checkpoint-num-layers": 3}, "--activations-checkpoint-num-layers"),
]


@pytest.mark.parametrize("changes, flag", RULES, ids=[f"{flag} {i}" for i, (_, flag) in enumerate(RULES)])
def test_rule(changes, flag, entry_point):
    check_one_line(entry_point, flags(changes), 1, flag)


def test_weighted_split_path_rules(entry_point, tmp_path):
    d = _dataset(tmp_path)
    real = {"--mock-data": "drop", "--tokenizer-type": "NullTokenizer"}
    train = "--train-weighted-split-paths"
    cases = [
        ({train: f"T: 1 0:0.8 {d}", "--data-path": d}, "--data-path"),
        ({train: f"T 1 0:0.8 {d}"}, train),                                   # no NAME:
        ({train: "T: 1 0:0.8"}, train),                                      # no PATH
        ({train: f"T: one 0:0.8 {d}"}, train),                                # weight not a number
        ({train: f"T: 1 0.8:0.2 {d}"}, train),                                # START > END
        ({train: f"T: 1 0:1.5 {d}"}, train),                                  # beyond the documents
        ({train: f"T: 1 0:0.8 {d}x"}, train),                                 # no such dataset
        ({train: f"T: 1 0.5:0.52 {d}"}, train),                               # no document of 10 in it
        ({train: [f"T: 1 0:0.8 {d}", f"U: 1 0:0.8 {d}"]}, train),             # two training groups
        ({"--valid-weighted-split-paths": f"V: 1 0.8:1 {d}"}, train),         # valid without train
        ({train: f"T: 1 0:0.8 {d}", "--valid-weighted-split-paths": [f"V: 1 0.8:1 {d}", f"V: 1 0.9:1 {d}"]},
         "--valid-weighted-split-paths"),                                     # a name twice
        ({train: f"T: 1 0:0.8 {d}", "--valid-weighted-split-paths-path": tmp_path / "nope"},
         "--valid-weighted-split-paths-path"),
    ]
    not_quoted = tmp_path / "groups.txt"
    not_quoted.write_text(f"V: 1 0.8:1 {d}\n")
    cases.append(({train: f"T: 1 0:0.8 {d}", "--valid-weighted-split-paths-path": not_quoted},
                  "--valid-weighted-split-paths-path"))
    for changes, flag in cases:
        check_one_line(entry_point, flags({**real, **changes}), 1, flag)


def _param_count():
    spec = importlib.util.spec_from_file_location(
        "param_count", os.path.join(os.path.dirname(__file__), "..", "..", "tools", "param_count.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_param_count_tool_follows_the_checkpoint_method():
    """8 layers over PP=2 (4 + 4), h 256, s 512: block with N = 3 recomputes 3 layers per stage."""
    tool = _param_count()
    base = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
            "--vocab-size", "1024", "--pipeline-model-parallel-size", "2", "--global-batch-size", "2",
            "--micro-batch-size", "1"]

    def report(*extra):
        return tool.report(tool.parse_args(base + list(extra)))

    def flops(lines):
        [line] = [x for x in lines if x.startswith("FLOPs per iteration")]
        return int(line.split(": ")[1].replace(",", ""))

    s, h = 512, 256
    layer_forward = 24 * s * h * h + 4 * s * s * h  # QKV + projection + MLP 24sh^2, attention 4s^2h
    plain = flops(report())
    assert report("--activations-checkpoint-method", "uniform", "--activations-checkpoint-num-layers", "2") == \
        report("--checkpoint-activations", "--checkpoint-num-layers", "2")
    assert flops(report("--checkpoint-activations")) - plain == 2 * 8 * layer_forward  # global batch 2
    block = report("--activations-checkpoint-method", "block", "--activations-checkpoint-num-layers", "3")
    assert flops(block) - plain == 2 * 6 * layer_forward
    assert "FLOPs per sample (model, fwd+bwd, recompute of the first 3 layer(s) of each stage)" in "\n".join(block)
    assert "checkpointed activations (block: first 3 layer(s) of each stage)" in "\n".join(block)

    def activations(lines):  # the activations column of the memory table's row of each stage
        rows = [x.split("|") for x in lines if x.startswith(("      0 |", "      1 |"))]
        return [int(row[5].replace(",", "")) for row in rows if len(row) == 7]

    # block over every layer of a stage keeps what uniform chunks of one layer keep
    assert activations(report("--activations-checkpoint-method", "block", "--activations-checkpoint-num-layers", "4")) \
        == activations(report("--checkpoint-activations"))
    # each layer left out of the block keeps all its activations instead of its input
    unchecked = activations(report())
    assert activations(report("--activations-checkpoint-method", "uniform")) < activations(block) < unchecked


def test_block_method_activation_estimate_equals_the_bytes_saved_for_backward():
    """4 layers at PP=2 with the block method over the first layer of each stage: the memory
    estimate equals what autograd really saved in the trainer's first iteration (to the byte here,
    as the uniform method's in tests/integration/test_memory_measured.py)."""
    from tests.support.distributed import run_distributed
    from tests.support.memory_runs import check_exact, first_iteration
    flags = ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8",
             "--activations-checkpoint-method", "block", "--activations-checkpoint-num-layers", "1"]
    rows = run_distributed(2, first_iteration, flags, pp=2)[0]
    check_exact(rows)
    for rank, _, _, _, predicted, measured in rows:
        assert predicted["activations"] == measured["activations"], rank
