"""The document ranges of --train/valid/test-weighted-split-paths (megatron/data/weighted_split_paths.py):
which documents a group's datasets read, for fractions whose products with the document count round
down and up, ties included. BigScience's get_split_by_range_ takes round(fraction x documents) with
Python's round (ties to the even integer); the expected ranges below are worked out by hand that way,
and checked against the documents the built datasets really return (each document's tokens name it)."""
import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.data.weighted_split_paths import build_group_dataset, parse_group
from megatron.runtime.refusal import ConfigError

DOC_TOKENS = 4  # every document: 4 copies of its own id


def write_documents(prefix, first_id, count):
    """`count` documents; document i holds the token first_id + i, DOC_TOKENS times."""
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for i in range(count):
        builder.add_item(np.full(DOC_TOKENS, first_id + i))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture
def data(tmp_path):
    """a: 10 documents (tokens 100..109); b: 7 documents (tokens 200..206)."""
    return {"a": write_documents(str(tmp_path / "a"), 100, 10), "b": write_documents(str(tmp_path / "b"), 200, 7),
            "cache": str(tmp_path / "cache")}


def documents_read(dataset):
    tokens = set()
    for i in range(len(dataset)):
        tokens.update(int(t) for t in dataset[i]["text"])
    return tokens


# (dataset, documents, range, [first, last) by hand)
RANGES = [
    ("a", 10, "0.25:0.75", (2, 8)),   # 2.5 -> 2 (a tie, down to even), 7.5 -> 8 (a tie, up to even)
    ("a", 10, "0.34:0.66", (3, 7)),   # 3.4 -> 3 (down), 6.6 -> 7 (up)
    ("a", 10, "0.45:0.55", (4, 6)),   # 4.5 -> 4 (a tie, down), 5.5 -> 6 (a tie, up)
    ("a", 10, "0:1", (0, 10)),
    ("b", 7, "0.5:1", (4, 7)),        # 3.5 -> 4 (a tie, up to even)
    ("b", 7, "0.3:0.9", (2, 6)),      # 2.1 -> 2 (down), 6.3 -> 6 (down)
    ("b", 7, "0.1:0.35", (1, 2)),     # 0.7 -> 1 (up), 2.45 -> 2 (down)
]


@pytest.mark.parametrize("name, count, span, expected", RANGES, ids=[f"{r[0]} {r[2]}" for r in RANGES])
def test_a_group_of_one_reads_its_documents_range(data, name, count, span, expected):
    group = parse_group(f"G: 1 {span} {data[name]}", "--train-weighted-split-paths")
    first_id = {"a": 100, "b": 200}[name]
    dataset = build_group_dataset(group, "train", 40, DOC_TOKENS - 1, seed=1, cache_path=data["cache"])
    assert documents_read(dataset) == {first_id + d for d in range(*expected)}


def test_a_blend_reads_each_datasets_own_range(data):
    """Two datasets in one group, each cut by its own range (rounded on its own document count)."""
    group = parse_group(f"T: 0.4 0.25:0.75 {data['a']}, 0.6 0.5:1 {data['b']}", "--train-weighted-split-paths")
    dataset = build_group_dataset(group, "train", 60, DOC_TOKENS - 1, seed=1, cache_path=data["cache"])
    read = documents_read(dataset)
    assert {t for t in read if t < 200} == {102, 103, 104, 105, 106, 107}  # a: [2, 8)
    assert {t for t in read if t >= 200} == {204, 205, 206}                # b: [4, 7)


def test_a_range_that_rounds_to_no_document_is_one_line(data):
    """0.15 x 10 = 1.5 -> 2 and 0.25 x 10 = 2.5 -> 2 (both ties, to even): no document, refused.
    (Rounding ties up would read document 2, truncating document 1.)"""
    with pytest.raises(ConfigError) as refused:
        parse_group(f"V: 1 0.15:0.25 {data['a']}", "--valid-weighted-split-paths")
    assert str(refused.value) == (f"--valid-weighted-split-paths group V: range 0.15:0.25 of {data['a']} holds none "
                                  f"of its 10 documents; widen it")
