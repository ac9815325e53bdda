"""Megatron's memory-mapped indexed dataset: token sequences in a .bin, offsets in an .idx.

.idx layout (little endian), compatible with Megatron-LM / Megatron-DeepSpeed:
  9-byte magic b"MMIDIDX\\x00\\x00", uint64 version (1), uint8 dtype code,
  uint64 number of sequences, uint64 number of doc_idx entries,
  int32 sizes[sequences], int64 byte pointers[sequences], int64 doc_idx[...].
doc_idx holds the first sequence index of each document plus a final
len(sizes); with one sequence per document it is simply 0..n.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import numpy.typing as npt
import torch

from megatron.runtime.atomic_write import AtomicFile

_HDR_MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
_HEADER_SIZE = len(_HDR_MAGIC) + struct.calcsize("<QBQQ")
# dtype codes as Megatron-LM writes them (token data only ever uses 4 and 8).
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def code(dtype: npt.DTypeLike) -> int:
    for k, v in DTYPES.items():
        if v == np.dtype(dtype):
            return k
    raise ValueError(
        f"dtype {np.dtype(dtype)} cannot be stored in an indexed dataset; "
        f"use one of {sorted({np.dtype(v).name for v in DTYPES.values()})}"
    )


def best_fitting_dtype(vocab_size: int) -> type[np.integer]:
    # uint16 halves the file size; Megatron keeps a margin below 65536.
    return np.uint16 if vocab_size < 65500 else np.int32


def index_file_path(prefix_path: str) -> str:
    return prefix_path + ".idx"


def data_file_path(prefix_path: str) -> str:
    return prefix_path + ".bin"


def dataset_exists(prefix_path: str) -> bool:
    return os.path.isfile(index_file_path(prefix_path)) and os.path.isfile(data_file_path(prefix_path))


def make_dataset(path: str, impl: str = "mmap", skip_warmup: bool = True) -> MMapIndexedDataset:
    # "infer" (Megatron's default) can only find mmap here; the header check rejects anything else.
    if impl not in ("mmap", "infer"):
        raise ValueError(
            f"--data-impl {impl!r} is not supported; "
            f"only 'mmap' datasets (written by tools/preprocess_data.py) are read"
        )
    return MMapIndexedDataset(path, skip_warmup)


def _missing_file_error(prefix_path: str, path: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"--data-path {prefix_path}: {path} does not exist; the prefix names the .bin/.idx pair "
        f"without extension (e.g. data/corpus_text_document), made by tools/preprocess_data.py"
    )


def _warmup_mmap_file(path: str) -> None:
    # Read the file once so the page cache holds it before training starts.
    with open(path, "rb") as stream:
        while stream.read(100 * 1024 * 1024):
            pass


class MMapIndexedDataset(torch.utils.data.Dataset):
    """Random access to the token sequences of a .bin/.idx pair without loading them."""

    class Index:
        def __init__(self, path: str, prefix_path: str, skip_warmup: bool = True) -> None:
            if not os.path.isfile(path):
                raise _missing_file_error(prefix_path, path)
            with open(path, "rb") as stream:
                header = stream.read(_HEADER_SIZE)
            if len(header) < _HEADER_SIZE or header[: len(_HDR_MAGIC)] != _HDR_MAGIC:
                raise ValueError(
                    f"{path} is not an mmap indexed dataset index (bad header); "
                    f"rebuild it with tools/preprocess_data.py"
                )
            version, dtype_code, num_sequences, num_docs = struct.unpack("<QBQQ", header[len(_HDR_MAGIC):])
            if version != _VERSION or dtype_code not in DTYPES:
                raise ValueError(
                    f"{path}: unsupported index version {version} / dtype code {dtype_code}; "
                    f"rebuild it with tools/preprocess_data.py"
                )
            self.dtype = np.dtype(DTYPES[dtype_code])
            expected = len(header) + num_sequences * (4 + 8) + num_docs * 8
            if os.path.getsize(path) != expected:
                raise ValueError(
                    f"{path} has {os.path.getsize(path)} bytes but its header implies {expected}; "
                    f"it is truncated or corrupt, rerun tools/preprocess_data.py"
                )
            if not skip_warmup:
                _warmup_mmap_file(path)
            self._bin_buffer = np.memmap(path, mode="r", order="C")
            offset = len(header)
            self.sizes = np.frombuffer(self._bin_buffer, dtype=np.int32, count=num_sequences, offset=offset)
            offset += self.sizes.nbytes
            self.pointers = np.frombuffer(self._bin_buffer, dtype=np.int64, count=num_sequences, offset=offset)
            offset += self.pointers.nbytes
            self.doc_idx = np.frombuffer(self._bin_buffer, dtype=np.int64, count=num_docs, offset=offset)

        def __len__(self) -> int:
            return len(self.sizes)

    def __init__(self, path: str, skip_warmup: bool = True) -> None:
        super().__init__()
        self._do_init(path, skip_warmup)

    def _do_init(self, path: str, skip_warmup: bool) -> None:
        self._path = path
        self._skip_warmup = skip_warmup
        self._index = self.Index(index_file_path(path), path, skip_warmup)
        bin_path = data_file_path(path)
        if not os.path.isfile(bin_path):
            raise _missing_file_error(path, bin_path)
        expected = (
            int(self._index.pointers[-1]) + int(self._index.sizes[-1]) * self._index.dtype.itemsize
            if len(self._index) else 0
        )
        actual = os.path.getsize(bin_path)
        if actual != expected:
            raise ValueError(
                f"--data-path {path}: {bin_path} has {actual} bytes but {index_file_path(path)} describes {expected}; "
                f"the pair is truncated or from different runs, rerun tools/preprocess_data.py"
            )
        if not skip_warmup:
            _warmup_mmap_file(bin_path)
        # np.memmap cannot map an empty file; an all-empty dataset has no tokens to read anyway.
        self._bin_buffer: np.ndarray = (
            np.memmap(bin_path, mode="r", order="C") if actual else np.empty(0, dtype=np.uint8)
        )

    # Pickle by path so DataLoader workers reopen the mapping instead of copying the data.
    def __getstate__(self) -> tuple[str, bool]:
        return self._path, self._skip_warmup

    def __setstate__(self, state: tuple[str, bool]) -> None:
        self._do_init(*state)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, idx: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("MMapIndexedDataset slices must be contiguous (step 1)")
            return [self.get(i) for i in range(start, stop)]
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence idx from offset, `length` of them (default: to the end)."""
        size = int(self._index.sizes[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) are outside sequence {idx} of length {size}")
        pointer = int(self._index.pointers[idx]) + offset * self._index.dtype.itemsize
        return np.frombuffer(self._bin_buffer, dtype=self._index.dtype, count=length, offset=pointer)

    @property
    def sizes(self) -> np.ndarray:
        return self._index.sizes

    @property
    def doc_idx(self) -> np.ndarray:
        return self._index.doc_idx

    @property
    def dtype(self) -> np.dtype:
        return self._index.dtype


class MMapIndexedDatasetBuilder:
    """Appends sequences to a .bin and writes the matching .idx on finalize.

    Both files are written under temporary names and renamed into place only by
    finalize(), the .idx last, so an interrupted run never leaves a pair that
    looks valid.
    """

    def __init__(self, out_file: str, dtype: npt.DTypeLike = np.int64) -> None:
        self._dtype = np.dtype(dtype)
        code(self._dtype)  # fail now, not after writing all the data
        self._out_file = out_file
        self._data = AtomicFile(out_file, "wb")
        self._data_file = self._data.file
        self._sizes: list[int] = []
        self._doc_idx = [0]

    def add_item(self, tensor: npt.ArrayLike) -> None:
        array = np.asarray(tensor)
        if array.size and self._dtype.kind in "iu":
            info = np.iinfo(self._dtype)
            if array.min() < info.min or array.max() > info.max:
                raise ValueError(
                    f"token ids {array.min()}..{array.max()} do not fit the dataset dtype {self._dtype}"
                )
        self._data_file.write(array.astype(self._dtype, copy=False).tobytes(order="C"))
        self._sizes.append(array.size)

    def end_document(self) -> None:
        self._doc_idx.append(len(self._sizes))

    def finalize(self, index_file: str) -> None:
        sizes = np.array(self._sizes, dtype=np.int32)
        byte_sizes = sizes.astype(np.int64) * self._dtype.itemsize
        pointers = np.zeros(len(sizes), dtype=np.int64)
        pointers[1:] = np.cumsum(byte_sizes)[:-1]
        doc_idx = np.array(self._doc_idx, dtype=np.int64)
        index = AtomicFile(index_file, "wb")
        stream = index.file
        stream.write(_HDR_MAGIC)
        stream.write(struct.pack("<QBQQ", _VERSION, code(self._dtype), len(sizes), len(doc_idx)))
        stream.write(sizes.tobytes(order="C"))
        stream.write(pointers.tobytes(order="C"))
        stream.write(doc_idx.tobytes(order="C"))
        # Drop a previous .idx first: between the two renames the new .bin must
        # not sit next to an old .idx that would still open without error.
        if os.path.exists(index_file):
            os.remove(index_file)
        self._data.commit()
        index.commit()

    def abort(self) -> None:
        """Discard everything written so far."""
        self._data.discard()
