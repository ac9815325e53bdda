"""Argonne's --data-file-list: a file of `WEIGHT PREFIX CORPUS` lines is --data-path's weighted blend
(the datasets built from it draw each source its weight's share, counted by hand); a missing file,
a bad line (named by its number) or a clash with --data-path is one line, before anything is built."""
import numpy as np
import pytest

from megatron.data.gpt_dataset import build_train_valid_test_datasets
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.runtime.refusal import ConfigError
from tests.support.flag_runs import MERGES, VOCAB
from tests.support.validated_args import BASE, validated

REAL = [a for a in BASE if a not in ("--mock-data", "--vocab-size", "600")] + ["--vocab-file", VOCAB,
                                                                                  "--merge-file", MERGES]


def _write(prefix, seed):
    rng = np.random.RandomState(seed)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(40):
        builder.add_item(rng.randint(0, 50000, size=rng.randint(1, 60)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def test_the_file_is_the_data_path_blend(tmp_path):
    a, b = _write(str(tmp_path / "a_text_document"), 5), _write(str(tmp_path / "b_text_document"), 6)
    listing = tmp_path / "files.txt"
    # the fork's lines: weight, prefix (a .bin suffix is dropped, as the fork does), corpus; blank lines skipped
    listing.write_text(f"0.25 {a} books\n\n0.75 {b}.bin arxiv\n")
    args = validated(["--data-file-list", listing, "--split", "1,0,0"], base=REAL)
    assert args.data_path == ["0.25", a, "0.75", b]
    train, valid, test = build_train_valid_test_datasets(args.data_path, "mmap", args.split, [400, 0, 0], 8, 1, True)
    assert valid is None and test is None
    assert np.bincount(train.dataset_index).tolist() == [100, 300]  # 0.25 and 0.75 of 400 samples


@pytest.mark.parametrize("text, line", [
    ("0.5 data/a_text_document books\n0.5 data/b_text_document arxiv extra\n",
     "line 2: '0.5 data/b_text_document arxiv extra' is not WEIGHT PREFIX CORPUS (a number, a dataset prefix, a "
     "corpus name)"),
    ("\nabc data/a_text_document books\n",
     "line 2: weight 'abc' is not a non-negative number (WEIGHT PREFIX CORPUS (a number, a dataset prefix, a corpus "
     "name))"),
    ("-1 data/a_text_document books\n", "line 1: weight '-1' is not a non-negative number (WEIGHT PREFIX CORPUS (a "
                                        "number, a dataset prefix, a corpus name))"),
    ("\n\n", ": lists no dataset (WEIGHT PREFIX CORPUS (a number, a dataset prefix, a corpus name), one per line)"),
    ("0 data/a_text_document books\n", ": the weights sum to 0; give at least one a positive weight"),
])
def test_a_bad_line_is_named_by_its_number(tmp_path, text, line):
    listing = tmp_path / "files.txt"
    listing.write_text(text)
    with pytest.raises(ConfigError) as refused:
        validated(["--data-file-list", listing], base=REAL)
    assert str(refused.value) == f"--data-file-list {listing}{' ' if line.startswith('line') else ''}{line}"


def test_missing_file_and_two_ways_to_give_the_data(tmp_path):
    with pytest.raises(ConfigError) as refused:
        validated(["--data-file-list", tmp_path / "none.txt"], base=REAL)
    assert str(refused.value) == f"--data-file-list {tmp_path / 'none.txt'}: no such file"
    listing = tmp_path / "files.txt"
    listing.write_text("1 data/a_text_document books\n")
    for other in (["--data-path", "data/a_text_document"], ["--mock-data"]):
        with pytest.raises(ConfigError) as refused:
            validated(["--data-file-list", listing, *other], base=REAL)
        assert str(refused.value) == "--data-file-list and --data-path / --mock-data are two ways to give the data: " \
                                     "use one"
