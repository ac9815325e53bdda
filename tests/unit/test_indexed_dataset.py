"""Megatron mmap indexed dataset: exact on-disk layout, random access, atomic writes, clear errors."""
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from megatron.data import indexed_dataset
from megatron.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder, dataset_exists, make_dataset


def write_dataset(prefix, docs, dtype=np.uint16):
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        builder.add_item(doc)
        builder.end_document()
    builder.finalize(prefix + ".idx")


@pytest.fixture
def docs():
    rng = np.random.RandomState(0)
    lengths = [5, 0, 1, 17, 300, 2]  # includes an empty document
    return [rng.randint(0, 8192, size=n) for n in lengths]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_round_trip(tmp_path, docs, dtype):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, docs, dtype)
    ds = make_dataset(prefix, "mmap", skip_warmup=False)
    assert len(ds) == len(docs)
    assert ds.dtype == dtype
    assert ds.sizes.tolist() == [len(d) for d in docs]
    assert ds.doc_idx.tolist() == list(range(len(docs) + 1))
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
    np.testing.assert_array_equal(ds.get(4, offset=10, length=7), docs[4][10:17])
    np.testing.assert_array_equal(ds.get(4, offset=290), docs[4][290:])
    assert [a.tolist() for a in ds[2:4]] == [docs[2].tolist(), docs[3].tolist()]


def test_on_disk_layout_is_megatrons(tmp_path):
    prefix = str(tmp_path / "ds")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for seq in ([1, 2, 3], [4], [5, 6]):
        builder.add_item(torch.IntTensor(seq))  # Megatron's tools pass torch tensors
    builder.end_document()  # one document of three sequences
    builder.finalize(prefix + ".idx")
    with open(prefix + ".idx", "rb") as f:
        raw = f.read()
    expected = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<QBQQ", 1, 8, 3, 2)  # version 1, uint16 code 8, 3 sequences, 2 doc_idx entries
        + np.array([3, 1, 2], np.int32).tobytes()
        + np.array([0, 6, 8], np.int64).tobytes()  # byte pointers
        + np.array([0, 3], np.int64).tobytes()
    )
    assert raw == expected
    with open(prefix + ".bin", "rb") as f:
        assert f.read() == np.arange(1, 7, dtype=np.uint16).tobytes()


def test_builder_writes_nothing_visible_until_finalize(tmp_path, docs):
    prefix = str(tmp_path / "ds")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    builder.add_item(docs[0])
    builder.end_document()
    assert not os.path.exists(prefix + ".bin") and not os.path.exists(prefix + ".idx")
    builder.abort()
    assert os.listdir(tmp_path) == []


def test_finalize_removes_old_index_before_replacing_the_data(tmp_path, docs, monkeypatch):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, docs)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    builder.add_item(np.arange(10))
    builder.end_document()
    real_replace = os.replace

    def crash_on_index(src, dst):
        if dst.endswith(".idx"):
            raise KeyboardInterrupt("killed between the two renames")
        real_replace(src, dst)

    monkeypatch.setattr(indexed_dataset.os, "replace", crash_on_index)
    with pytest.raises(KeyboardInterrupt):
        builder.finalize(prefix + ".idx")
    # New .bin without any .idx: not mistaken for a valid dataset.
    assert not dataset_exists(prefix)
    with pytest.raises(FileNotFoundError, match="ds.idx does not exist"):
        MMapIndexedDataset(prefix)


def test_pickles_by_path(tmp_path, docs):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, docs)
    ds = MMapIndexedDataset(prefix)
    state = pickle.dumps(ds)
    assert len(state) < 500  # the path, not the tokens
    np.testing.assert_array_equal(pickle.loads(state)[4], docs[4])


def test_missing_files_name_data_path_and_the_fix(tmp_path, docs):
    prefix = str(tmp_path / "ds")
    with pytest.raises(FileNotFoundError,
                       match=rf"--data-path {prefix}: {prefix}.idx does not exist.*tools/preprocess_data.py"):
        make_dataset(prefix)
    write_dataset(prefix, docs)
    os.remove(prefix + ".bin")
    assert not dataset_exists(prefix)
    with pytest.raises(FileNotFoundError, match=rf"--data-path {prefix}: {prefix}.bin does not exist"):
        make_dataset(prefix)


def test_corrupt_files_are_rejected(tmp_path, docs):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, docs)
    assert dataset_exists(prefix)
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError,
                       match=r"ds.bin has 100 bytes but .*ds.idx describes 650; .*rerun tools/preprocess_data.py"):
        make_dataset(prefix)
    with open(prefix + ".idx", "r+b") as f:
        f.truncate(60)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        make_dataset(prefix)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"TNTIDX\x00\x00" + bytes(40))  # Megatron's old "cached" format
    with pytest.raises(ValueError, match="not an mmap indexed dataset index"):
        make_dataset(prefix)


def test_unsupported_impl_and_dtype_overflow(tmp_path):
    with pytest.raises(ValueError, match="--data-impl 'lazy' is not supported"):
        make_dataset(str(tmp_path / "ds"), "lazy")
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "ds.bin"), dtype=np.uint16)
    with pytest.raises(ValueError, match="do not fit the dataset dtype uint16"):
        builder.add_item(np.array([1, 70000]))
    builder.abort()


def test_get_out_of_range(tmp_path, docs):
    prefix = str(tmp_path / "ds")
    write_dataset(prefix, docs)
    ds = MMapIndexedDataset(prefix)
    with pytest.raises(IndexError, match=r"tokens \[3, 6\) are outside sequence 0 of length 5"):
        ds.get(0, offset=3, length=3)
