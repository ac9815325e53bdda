"""--train-data-path / --valid-data-path / --test-data-path (Megatron-LM, Microsoft's fork): each
split reads its own data, whole (no --split), a weighted list blending as --data-path's does.
Four datasets whose documents hold disjoint token ranges (A: 1000+, B: 2000+, V: 3000+, T: 4000+,
document i all token base+i, 10 tokens each) tell every sample's source apart. In-process: the
provider pretrain_gpt.py hands the trainer, on real indexed files."""
from argparse import Namespace

import numpy as np
import pytest

from megatron.runtime.refusal import ConfigError
from tests.support.validated_args import validated

DOCS = 20
SEQ = 8


def write_dataset(prefix, docs):
    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in docs:
        builder.add_item(np.asarray(doc))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture
def prefixes(tmp_path):
    return {name: write_dataset(str(tmp_path / name), [[base + i] * 10 for i in range(DOCS)])
            for name, base in (("A", 1000), ("B", 2000), ("V", 3000), ("T", 4000))}


def _sources(dataset):
    """The dataset's samples, each as the set of token bases (thousands) it holds, and the
    documents (token values) seen."""
    samples = [np.asarray(dataset[i]["text"]) for i in range(len(dataset))]
    return [set((s // 1000).tolist()) for s in samples], set(np.concatenate(samples).tolist())


def test_each_split_reads_its_own_data_whole(prefixes, tmp_path):
    import pretrain_gpt
    args = Namespace(mock_data=False, weighted_split_groups={}, data_impl="mmap", seq_length=SEQ, seed=1234,
                     data_cache_path=str(tmp_path / "cache"), data_path=None, split=None,
                     train_data_path=["1", prefixes["A"], "3", prefixes["B"]],
                     valid_data_path=[prefixes["V"]], test_data_path=[prefixes["T"]])
    train, valid, test = pretrain_gpt.train_valid_test_datasets_provider(args, [400, 40, 30])
    (train_src, _), (valid_src, valid_tokens), (test_src, test_tokens) = map(_sources, (train, valid, test))
    # a blend holds exactly the samples asked for, a single dataset whole epochs (at least as many)
    assert len(train) == 400 and len(valid) >= 40 and len(test) >= 30
    # a sample of the blend comes from one dataset; weights 1:3 of 400 samples: 100 from A, 300 from B
    assert sum(s == {1} for s in train_src) == 100 and sum(s == {2} for s in train_src) == 300
    assert all(s == {3} for s in valid_src) and all(s == {4} for s in test_src)
    # whole: every document of V and of T is read (--split's 969,30,1 would leave them 0.6 documents)
    assert valid_tokens == set(range(3000, 3000 + DOCS)) and test_tokens == set(range(4000, 4000 + DOCS))
    # a split without a path gets nothing
    args.test_data_path = None
    assert pretrain_gpt.train_valid_test_datasets_provider(args, [400, 40, 30])[2] is None


def test_flags_refused_as_megatron_lm_does(prefixes):
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "8",
            "--max-position-embeddings", "8", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--train-iters", "10", "--lr", "1e-3", "--vocab-file", "data/gpt2-vocab.json",
            "--merge-file", "data/gpt2-merges.txt"]
    args = validated(["--train-data-path", prefixes["A"], "--valid-data-path", "2", prefixes["V"], "1",
                      prefixes["T"]], base=base)
    assert args.valid_data_path == ["2", prefixes["V"], "1", prefixes["T"]]
    for extra, message in ((["--train-data-path", prefixes["A"], "--data-path", prefixes["B"]],
                            "--train-data-path and --data-path / --data-file-list / --mock-data"),
                           (["--valid-data-path", prefixes["V"]], "need --train-data-path"),
                           (["--train-data-path", prefixes["A"], "--split", "98,2,0"], "drop --split"),
                           (["--train-data-path", "x", prefixes["A"]],
                            "--train-data-path takes one prefix or weight/prefix pairs")):
        with pytest.raises(ConfigError, match=message):
            validated(extra, base=base)
