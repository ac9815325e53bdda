"""GPT index building, caching, splits, blending and the pretraining sampler."""
import datetime
import glob
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch

from megatron.data import helpers
from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.data_samplers import MegatronPretrainingSampler, build_pretraining_data_loader
from megatron.data.gpt_dataset import GPTDataset, build_train_valid_test_datasets, get_train_valid_test_split_
from megatron.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder


def write_dataset(prefix, docs):
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in docs:
        builder.add_item(np.asarray(doc))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def random_docs(seed, n, max_len=60):
    rng = np.random.RandomState(seed)
    return [rng.randint(0, 60000, size=rng.randint(0, max_len)) for _ in range(n)]


def samples_in_order(dataset):
    """Items in sample_idx order, undoing the shuffle."""
    return [dataset[p]["text"] for p in np.argsort(dataset.shuffle_idx)]


@pytest.fixture
def build_counter(monkeypatch):
    calls = []
    real = helpers.build_sample_idx
    monkeypatch.setattr(helpers, "build_sample_idx", lambda *args: calls.append(args[2]) or real(*args))
    return calls


@pytest.mark.parametrize("seq_length", [1, 2, 7, 64, 500])
def test_vectorised_sample_idx_equals_megatron_loop(seq_length):
    rng = np.random.RandomState(seq_length)
    sizes = rng.randint(0, 40, size=200).astype(np.int32)
    sizes[[0, 5, 6, 7]] = 0  # empty documents, including the first
    documents = np.arange(200)
    tokens_per_epoch = int(sizes.sum())
    num_epochs = 3
    doc_idx = helpers.build_doc_idx(documents, num_epochs, np.random.RandomState(1), False)
    expected = helpers.build_sample_idx_loop(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    np.testing.assert_array_equal(
        helpers.build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch), expected)


def test_num_epochs_closed_form_matches_megatron_loop():
    def loop(tokens_per_epoch, seq_length, num_samples):
        epochs, total = 0, 0
        while True:
            epochs += 1
            total += tokens_per_epoch
            if (total - 1) // seq_length >= num_samples:
                return epochs

    for t, l, n in [(10, 3, 0), (10, 9, 1), (10, 10, 1), (1000, 128, 7), (1000, 128, 8), (17, 16, 50),
                    (12345, 2048, 99999)]:
        assert helpers.num_epochs(t, l, n) == loop(t, l, n), (t, l, n)


def test_samples_are_the_shuffled_documents_cut_into_overlapping_windows(tmp_path):
    docs = random_docs(0, 40)
    prefix = write_dataset(str(tmp_path / "ds"), docs)
    indexed = MMapIndexedDataset(prefix)
    documents = np.arange(5, 35)
    seq_length = 16
    ds = GPTDataset("train", prefix, documents, indexed, 200, seq_length, seed=3)
    tokens_per_epoch = sum(len(docs[d]) for d in documents)
    epochs = ds.doc_idx.shape[0] // len(documents)
    assert epochs == helpers.num_epochs(tokens_per_epoch, seq_length, 200) > 1
    assert len(ds) == (epochs * tokens_per_epoch - 1) // seq_length >= 200
    # The last epoch is used for over 80% of its samples, so all epochs are shuffled together.
    assert sorted(ds.doc_idx) == sorted(list(documents) * epochs)
    assert list(ds.doc_idx[: len(documents)]) != list(documents)
    stream = np.concatenate([docs[d] for d in ds.doc_idx])
    for k, sample in enumerate(samples_in_order(ds)):
        assert sample.dtype == np.int64 and sample.shape == (seq_length + 1,)
        np.testing.assert_array_equal(sample, stream[k * seq_length: (k + 1) * seq_length + 1])
    assert sorted(ds.shuffle_idx) == list(range(len(ds)))


def test_partly_used_last_epoch_is_shuffled_separately(tmp_path):
    docs = [np.arange(10)] * 20  # 200 tokens per epoch
    prefix = write_dataset(str(tmp_path / "ds"), docs)
    # 2 full epochs give (400-1)//10 = 39 samples; 45 needs a third epoch, used for 6 of its 19 samples (< 80%).
    ds = GPTDataset("train", prefix, np.arange(20), MMapIndexedDataset(prefix), 45, 10, seed=0)
    assert len(ds.doc_idx) == 60
    assert sorted(ds.doc_idx[:40]) == sorted(list(range(20)) * 2)
    assert sorted(ds.doc_idx[40:]) == list(range(20))
    assert sorted(ds.shuffle_idx[:39]) == list(range(39))
    assert sorted(ds.shuffle_idx[39:]) == list(range(39, len(ds)))


def test_index_cache_is_reused_and_rebuilt_on_changes(tmp_path, build_counter):
    prefix = write_dataset(str(tmp_path / "ds"), random_docs(1, 50))

    def build(num_samples=100, seq_length=8, seed=1):
        return build_train_valid_test_datasets([prefix], "mmap", "1,0,0", [num_samples, 0, 0], seq_length, seed,
                                               True)[0]

    first = build()
    files = sorted(glob.glob(prefix + "_train_indexmap_100ns_8sl_1s_*.npy"))
    assert len(files) == 3 and len(build_counter) == 1
    mtimes = [os.stat(f).st_mtime_ns for f in files]
    second = build()
    assert len(build_counter) == 1
    assert [os.stat(f).st_mtime_ns for f in files] == mtimes
    np.testing.assert_array_equal(second.sample_idx, first.sample_idx)
    np.testing.assert_array_equal(second[7]["text"], first[7]["text"])
    build(num_samples=101)
    build(seq_length=9)
    build(seed=2)
    assert len(build_counter) == 4
    os.remove(files[1])  # an incomplete cache is rebuilt, not half-loaded
    build()
    assert len(build_counter) == 5
    assert not glob.glob(str(tmp_path / "*.tmp*"))

    new_docs = random_docs(2, 50)
    write_dataset(prefix, new_docs)  # the data changes under the same prefix
    rebuilt = build()
    assert len(build_counter) == 6
    stream = np.concatenate([new_docs[d] for d in rebuilt.doc_idx])
    np.testing.assert_array_equal(samples_in_order(rebuilt)[3], stream[24:33])


def _build_on_rank(rank, store, prefix, results):
    try:
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                             timeout=datetime.timedelta(seconds=30))
        calls = []
        real = helpers.build_sample_idx

        def slow_build(*args):
            calls.append(1)
            time.sleep(0.5)  # rank 1 must wait at the barrier, not read missing files
            return real(*args)

        helpers.build_sample_idx = slow_build
        ds = GPTDataset("train", prefix, np.arange(30), MMapIndexedDataset(prefix), 50, 8, seed=5)
        results.put((rank, len(calls), np.asarray(ds.sample_idx).tolist()))
        torch.distributed.destroy_process_group()
    except Exception as e:  # report instead of leaving the parent waiting
        results.put((rank, None, repr(e)))


def test_only_rank_0_builds_and_every_rank_loads(tmp_path):
    prefix = write_dataset(str(tmp_path / "ds"), random_docs(3, 30))
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_build_on_rank, args=(r, str(tmp_path / "store"), prefix, results)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = {rank: (calls, idx) for rank, calls, idx in (results.get(timeout=60) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=10)
            p.kill()
    assert got[0][0] == 1 and got[1][0] == 0, got
    assert got[0][1] == got[1][1]


@pytest.mark.parametrize(
    "splits, size, expected",
    [("969,30,1", 1000, [0, 969, 999, 1000]), ("969, 30, 1", 422, [0, 409, 422, 422]), ("1,1", 5, [0, 3, 5, 5]),
     ("100", 7, [0, 7, 7, 7]), ("8/1/1", 10, [0, 8, 9, 10])],
)
def test_split(splits, size, expected):
    assert get_train_valid_test_split_(splits, size) == expected


def test_empty_splits_and_zero_samples_give_none(tmp_path):
    prefix = write_dataset(str(tmp_path / "ds"), random_docs(4, 20))
    train, valid, test = build_train_valid_test_datasets([prefix], "mmap", "1,0,0", [30, 5, 5], 8, 1, True)
    assert len(train) >= 30 and valid is None and test is None
    train, valid, test = build_train_valid_test_datasets([prefix], "mmap", "6,2,2", [30, 5, 0], 8, 1, True)
    assert len(valid) >= 5 and test is None


def test_blending_indices_follow_weights_exactly():
    index, sample = helpers.build_blending_indices([0.2, 0.5, 0.3], 1000)
    assert np.bincount(index).tolist() == [200, 500, 300]
    for i in range(3):  # each source is read in order from its first sample
        assert sample[index == i].tolist() == list(range(np.count_nonzero(index == i)))
    counts = np.stack([np.cumsum(index == i) for i in range(3)], axis=1)
    shares = np.arange(1, 1001)[:, None] * np.array([0.2, 0.5, 0.3])
    assert np.abs(counts - shares).max() <= 1  # every prefix is within one sample of its share


def test_blending_indices_equal_sequential_reference():
    weights = np.array([0.13, 0.37, 0.05, 0.45])
    index, _ = helpers.build_blending_indices(weights, 777)
    counts = np.zeros(4, dtype=np.int64)
    expected = []
    for _ in range(777):  # Webster: next sample goes to the smallest (count + 1/2) / weight
        i = int(np.argmin((counts + 0.5) / weights))
        expected.append(i)
        counts[i] += 1
    assert index.tolist() == expected


def test_blended_datasets_from_data_path(tmp_path):
    a = write_dataset(str(tmp_path / "a"), random_docs(5, 40))
    b = write_dataset(str(tmp_path / "b"), random_docs(6, 40))
    train, valid, test = build_train_valid_test_datasets(["0.25", a, "0.75", b], "mmap", "1,0,0", [400, 0, 0],
                                                         8, 1, True)
    assert isinstance(train, BlendableDataset) and valid is None and test is None
    assert len(train) == 400
    assert np.bincount(train.dataset_index).tolist() == [100, 300]
    # Each source was asked for its share plus Megatron's 0.5%: ceil(400 * w * 1.005).
    assert len(glob.glob(a + "_train_indexmap_101ns_*_doc_idx.npy")) == 1
    assert len(glob.glob(b + "_train_indexmap_302ns_*_doc_idx.npy")) == 1
    for k in (0, 1, 2, 399):
        source = train.datasets[train.dataset_index[k]]
        np.testing.assert_array_equal(train[k]["text"], source[train.dataset_sample_index[k]]["text"])


def test_blend_that_overdraws_a_source_is_rejected(tmp_path):
    prefix = write_dataset(str(tmp_path / "ds"), random_docs(7, 10))
    small = GPTDataset("train", prefix, np.arange(10), MMapIndexedDataset(prefix), 5, 8, seed=1)
    with pytest.raises(ValueError, match=f"blended dataset 0 has {len(small)} samples but its weight needs"):
        BlendableDataset([small, small], [0.9, 0.1], 10 * len(small))


@pytest.mark.parametrize(
    "data_prefix, splits, match",
    [(["0.3", "a", "0.7"], "1,0,0", "--data-path takes one prefix or weight/prefix pairs"),
     (["a", "b"], "1,0,0", "--data-path takes one prefix or weight/prefix pairs"),
     (["0", "a", "0", "b"], "1,0,0", "--data-path weights must be non-negative with a positive sum"),
     (["ds"], "9,1,x", "--split '9,1,x' must be up to three non-negative weights"),
     (["ds"], "0,0,0", "--split '0,0,0' must be"),
     (["ds"], "1,1,1,1", "--split '1,1,1,1' must be")],
)
def test_bad_arguments(tmp_path, data_prefix, splits, match):
    write_dataset(str(tmp_path / "ds"), random_docs(8, 10))
    data_prefix = [str(tmp_path / p) if p == "ds" else p for p in data_prefix]
    with pytest.raises(ValueError, match=match):
        build_train_valid_test_datasets(data_prefix, "mmap", splits, [10, 0, 0], 8, 1, True)


def test_too_short_or_empty_data(tmp_path):
    short = write_dataset(str(tmp_path / "short"), [np.arange(4), np.arange(5)])
    with pytest.raises(ValueError, match=r"the train split has 9 tokens in 2 documents, "
                                         r"fewer than one sample of --seq-length 16 \+ 1"):
        build_train_valid_test_datasets([short], "mmap", "1,0,0", [10, 0, 0], 16, 1, True)
    empty = write_dataset(str(tmp_path / "empty"), [[], []])
    with pytest.raises(ValueError, match="the train split has 0 tokens"):
        build_train_valid_test_datasets([empty], "mmap", "1,0,0", [10, 0, 0], 16, 1, True)


def test_sampler_resume_continues_with_the_next_batch():
    mb, dp, total = 3, 4, 200
    full = {r: list(MegatronPretrainingSampler(total, 0, mb, r, dp)) for r in range(dp)}
    assert full[1][0] == [3, 4, 5] and full[3][2] == [33, 34, 35]
    assert len(full[0]) == total // (mb * dp)
    for k in (12, 60, 192):
        for r in range(dp):
            resumed = list(MegatronPretrainingSampler(total, k, mb, r, dp))
            assert resumed == full[r][k // (mb * dp):]
    assert len(MegatronPretrainingSampler(total, 60, mb, 2, dp)) == len(full[2]) - 5


def test_sampler_keeps_partial_last_batch_without_drop_last():
    batches = [list(MegatronPretrainingSampler(26, 5, 2, r, 3, drop_last=False)) for r in range(3)]
    assert batches[0][-1] == [23, 24] and batches[1][-1] == [25] and batches[2][-1] == [21, 22]
    assert [len(MegatronPretrainingSampler(26, 5, 2, r, 3, drop_last=False)) for r in range(3)] == [4, 4, 3]


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(consumed_samples=201), "consumed_samples=201 is outside the dataset's 200 samples"),
     (dict(data_parallel_rank=4), r"data_parallel_rank 4 is outside \[0, 4\)"),
     (dict(micro_batch_size=0), r"micro_batch_size \(0\) and data_parallel_size \(4\) must be positive")],
)
def test_sampler_errors(kwargs, match):
    args = dict(total_samples=200, consumed_samples=0, micro_batch_size=3, data_parallel_rank=0, data_parallel_size=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        MegatronPretrainingSampler(**args)


def test_data_loader_batches(tmp_path):
    prefix = write_dataset(str(tmp_path / "ds"), random_docs(9, 60))
    ds = GPTDataset("train", prefix, np.arange(60), MMapIndexedDataset(prefix), 40, 8, seed=1)
    loader = build_pretraining_data_loader(ds, consumed_samples=8, micro_batch_size=2, data_parallel_rank=1,
                                           data_parallel_size=2)
    batches = list(loader)
    assert len(batches) == len(loader) == (len(ds) - 8) // 4
    assert batches[0]["text"].dtype == torch.int64 and batches[0]["text"].shape == (2, 9)
    np.testing.assert_array_equal(batches[0]["text"].numpy(), np.stack([ds[10]["text"], ds[11]["text"]]))
    assert build_pretraining_data_loader(None, 0, 2, 0, 1) is None
    workers = build_pretraining_data_loader(ds, 8, 2, 1, 2, num_workers=2)
    assert all(torch.equal(x["text"], y["text"]) for x, y in zip(workers, batches, strict=True))


def test_data_cache_path_holds_the_index_caches(corpus, tmp_path):
    """--data-cache-path (Megatron-LM): the index caches go to that directory (created), none next to
    the data, and the samples are those of a build that caches next to the data; for --data-path and
    for weighted split paths alike."""
    import shutil

    import pretrain_gpt
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    data, cache, beside = tmp_path / "data", tmp_path / "cache", tmp_path / "beside"
    for where in (data, beside):
        where.mkdir()
        for suffix in (".bin", ".idx"):
            shutil.copy(corpus + suffix, where / ("corpus" + suffix))
    model = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "4",
             "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt"]

    def train_split(data_flags):
        args = validate_args(parse_args(args_list=model + data_flags), world_size=1, cuda_available=False)
        return pretrain_gpt.train_valid_test_datasets_provider(args, [40, 0, 0])[0]

    def flags(kind, where):
        prefix = str(where / "corpus")
        return (["--data-path", prefix, "--split", "1,0,0"] if kind == "data path" else
                ["--train-weighted-split-paths", f"TRAIN: 1 0:1 {prefix}"])

    for kind in ("data path", "weighted split paths"):
        cached = train_split(flags(kind, data) + ["--data-cache-path", str(cache)])
        reference = train_split(flags(kind, beside))
        assert sorted(os.listdir(data)) == ["corpus.bin", "corpus.idx"], kind
        assert any(name.startswith("corpus_train_indexmap_40ns_") for name in os.listdir(beside))
        assert sorted(n for n in os.listdir(cache)) == sorted(n for n in os.listdir(beside) if n.endswith(".npy"))
        assert len(cached) == len(reference)
        for i in range(len(reference)):
            assert np.array_equal(cached[i]["text"], reference[i]["text"]), (kind, i)
