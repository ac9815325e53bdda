"""GPT pretraining datasets: fixed-length token windows over shuffled documents."""
from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence

import numpy as np
import torch

from megatron.runtime.atomic_write import AtomicFile

from . import helpers
from .blendable_dataset import BlendableDataset
from .indexed_dataset import MMapIndexedDataset, make_dataset

# Megatron asks each blended source for 0.5% more samples than its share so
# that rounding in the blend never runs a source dry.
BLEND_OVERSAMPLE = 1.005


def build_train_valid_test_datasets(
    data_prefix: Sequence[str], data_impl: str, splits_string: str, train_valid_test_num_samples: Sequence[int],
    seq_length: int, seed: int, skip_warmup: bool, cache_path: str | None = None,
) -> tuple[torch.utils.data.Dataset | None, ...]:
    """(train, valid, test) datasets; each is None when its split is empty or asked for 0 samples.

    data_prefix is ["path"] or ["w1", "path1", "w2", "path2", ...] for a
    weighted blend of several preprocessed datasets. cache_path: --data-cache-path, the directory
    of the index caches (None: next to the data).
    """
    if len(data_prefix) == 1:
        return _build_train_valid_test_datasets(
            data_prefix[0], data_impl, splits_string, train_valid_test_num_samples, seq_length, seed, skip_warmup,
            cache_path,
        )

    prefixes, weights, per_dataset_num_samples = get_datasets_weights_and_num_samples(
        data_prefix, train_valid_test_num_samples
    )
    splits: list[list[tuple[GPTDataset, float]]] = [[], [], []]
    for prefix, weight, num_samples in zip(prefixes, weights, per_dataset_num_samples, strict=True):
        datasets = _build_train_valid_test_datasets(
            prefix, data_impl, splits_string, num_samples, seq_length, seed, skip_warmup, cache_path
        )
        for split, dataset in zip(splits, datasets, strict=True):
            if dataset is not None:
                split.append((dataset, weight))
    return tuple(
        BlendableDataset([d for d, _ in split], [w for _, w in split], size) if split and size > 0 else None
        for split, size in zip(splits, train_valid_test_num_samples, strict=True)
    )


# Megatron-LM's --train-data-path / --valid-data-path / --test-data-path: each split reads all of
# its own data, so each is the whole dataset at that split's position of a split string
WHOLE_SPLIT = ("1,0,0", "0,1,0", "0,0,1")


def build_per_split_datasets(
    split_prefixes: Sequence[Sequence[str] | None], data_impl: str, train_valid_test_num_samples: Sequence[int],
    seq_length: int, seed: int, skip_warmup: bool, cache_path: str | None = None,
) -> tuple[torch.utils.data.Dataset | None, ...]:
    """(train, valid, test) from a prefix (or weighted blend) per split; None for a split with no
    data or no samples asked for."""
    datasets = []
    for index, prefixes in enumerate(split_prefixes):
        num_samples = [n if i == index else 0 for i, n in enumerate(train_valid_test_num_samples)]
        if not prefixes or num_samples[index] == 0:
            datasets.append(None)
            continue
        built = build_train_valid_test_datasets(prefixes, data_impl, WHOLE_SPLIT[index], num_samples, seq_length,
                                                seed, skip_warmup, cache_path)
        datasets.append(built[index])
    return tuple(datasets)


def get_datasets_weights_and_num_samples(
    data_prefix: Sequence[str], train_valid_test_num_samples: Sequence[int],
) -> tuple[list[str], list[float], list[list[int]]]:
    """Prefixes, normalised weights and per-prefix [train, valid, test] sample counts of a blend."""
    usage = (
        "--data-path takes one prefix or weight/prefix pairs, "
        "e.g. '0.3 data/a_text_document 0.7 data/b_text_document'"
    )
    if len(data_prefix) % 2:
        raise ValueError(f"{usage}; got an odd number of values {data_prefix}")
    try:
        weights = [float(w) for w in data_prefix[0::2]]
    except ValueError:
        raise ValueError(f"{usage}; got {data_prefix}") from None
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"--data-path weights must be non-negative with a positive sum, got {weights}")
    weights = [w / sum(weights) for w in weights]
    prefixes = [p.strip() for p in data_prefix[1::2]]
    num_samples = [
        [int(math.ceil(n * w * BLEND_OVERSAMPLE)) for n in train_valid_test_num_samples] for w in weights
    ]
    return prefixes, weights, num_samples


def _build_train_valid_test_datasets(
    data_prefix: str, data_impl: str, splits_string: str, train_valid_test_num_samples: Sequence[int],
    seq_length: int, seed: int, skip_warmup: bool, cache_path: str | None = None,
) -> tuple[GPTDataset | None, ...]:
    indexed_dataset = make_dataset(data_prefix, data_impl, skip_warmup)
    splits = get_train_valid_test_split_(splits_string, len(indexed_dataset))
    datasets: list[GPTDataset | None] = []
    for index, name in enumerate(("train", "valid", "test")):
        num_samples = train_valid_test_num_samples[index]
        if splits[index + 1] > splits[index] and num_samples > 0:
            documents = np.arange(splits[index], splits[index + 1], dtype=np.int64)
            datasets.append(
                GPTDataset(name, data_prefix, documents, indexed_dataset, num_samples, seq_length, seed, cache_path)
            )
        else:
            datasets.append(None)
    return tuple(datasets)


def get_train_valid_test_split_(splits_string: str, size: int) -> list[int]:
    """Document boundaries [0, train_end, valid_end, size] from weights like '969,30,1'."""
    usage = (
        f"--split {splits_string!r} must be up to three non-negative weights with a positive sum, e.g. 969,30,1"
    )
    try:
        splits = [float(s) for s in splits_string.replace("/", ",").split(",")]
    except ValueError:
        raise ValueError(usage) from None
    if len(splits) > 3 or any(s < 0 for s in splits) or sum(splits) <= 0:
        raise ValueError(usage)
    splits += [0.0] * (3 - len(splits))
    splits = [s / sum(splits) for s in splits]
    index = [0]
    for split in splits:
        index.append(index[-1] + int(round(split * float(size))))
    # Rounding may over- or undershoot; shift the boundaries as Megatron does.
    diff = index[-1] - size
    return [index[0]] + [i - diff for i in index[1:]]


def _is_rank_0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


class GPTDataset(torch.utils.data.Dataset):
    """Samples of seq_length+1 tokens cut from the documents in a shuffled order.

    Item i is {"text": int64 array of seq_length+1 tokens}; consecutive samples
    overlap by one token so inputs and shifted labels cover every token.
    """

    def __init__(self, name: str, data_prefix: str, documents: np.ndarray, indexed_dataset: MMapIndexedDataset,
                 num_samples: int, seq_length: int, seed: int, cache_path: str | None = None) -> None:
        self.name = name
        self.indexed_dataset = indexed_dataset
        self.doc_idx, self.sample_idx, self.shuffle_idx = _build_index_mappings(
            name, data_prefix, documents, indexed_dataset.sizes, num_samples, seq_length, seed, cache_path
        )

    def __len__(self) -> int:
        # One less than sample_idx rows: each sample needs its end boundary.
        return self.sample_idx.shape[0] - 1

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        idx = self.shuffle_idx[idx]
        doc_f, offset_f = self.sample_idx[idx]
        doc_l, offset_l = self.sample_idx[idx + 1]
        if doc_f == doc_l:
            sample = self.indexed_dataset.get(
                self.doc_idx[doc_f], offset=offset_f, length=offset_l - offset_f + 1
            )
        else:
            parts = [self.indexed_dataset.get(self.doc_idx[doc_f], offset=offset_f)]
            parts += [self.indexed_dataset.get(self.doc_idx[i]) for i in range(doc_f + 1, doc_l)]
            parts.append(self.indexed_dataset.get(self.doc_idx[doc_l], length=offset_l + 1))
            sample = np.concatenate(parts)
        return {"text": np.array(sample, dtype=np.int64)}


def _index_fingerprint(documents: np.ndarray, sizes: np.ndarray) -> str:
    """Short hash of the document ids and their lengths: the only inputs of the
    index arrays besides the parameters in the file name. A changed dataset or
    --split changes it; a rebuilt but identical dataset keeps its cache."""
    digest = hashlib.blake2b(digest_size=6)
    digest.update(np.ascontiguousarray(documents, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(sizes[documents], dtype=np.int64).tobytes())
    return digest.hexdigest()


def _build_index_mappings(
    name: str, data_prefix: str, documents: np.ndarray, sizes: np.ndarray, num_samples: int, seq_length: int,
    seed: int, cache_path: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """doc_idx, sample_idx, shuffle_idx for num_samples samples, cached as .npy next to the data, or
    with cache_path (--data-cache-path, for data on a read-only or shared file system) in that
    directory under the data file's name (the fingerprint in the name tells same-named data apart).

    When torch.distributed is initialised only global rank 0 builds and saves;
    every rank then loads the same files.
    """
    tokens_per_epoch = int(np.sum(sizes[documents], dtype=np.int64))
    if tokens_per_epoch < seq_length + 1:
        raise ValueError(
            f"--data-path {data_prefix}: the {name} split has {tokens_per_epoch} tokens in {len(documents)} documents, "
            f"fewer than one sample of --seq-length {seq_length} + 1; use more data, a shorter --seq-length "
            f"or a larger {name} share in --split"
        )
    num_epochs = helpers.num_epochs(tokens_per_epoch, seq_length, num_samples)
    where = data_prefix if cache_path is None else os.path.join(cache_path, os.path.basename(data_prefix))
    filename = f"{where}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s_{_index_fingerprint(documents, sizes)}"
    paths = {key: f"{filename}_{key}.npy" for key in ("doc_idx", "sample_idx", "shuffle_idx")}

    if _is_rank_0() and not all(os.path.isfile(p) for p in paths.values()):
        start = time.time()
        if cache_path is not None:
            os.makedirs(cache_path, exist_ok=True)
        # Megatron's rule: when under 80% of the last epoch is needed, shuffle
        # it on its own and put its samples last in shuffle_idx, so the samples
        # trained on are whole epochs plus a random part of the last one,
        # rather than a mix that over-samples some documents.
        separate_last_epoch = False
        num_samples_from_full_epochs = None
        if num_epochs > 1:
            num_samples_from_full_epochs = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
            num_samples_per_epoch = (tokens_per_epoch - 1) // seq_length
            separate_last_epoch = num_samples - num_samples_from_full_epochs < int(0.80 * num_samples_per_epoch)
        np_rng = np.random.RandomState(seed=seed)
        doc_idx = helpers.build_doc_idx(documents, num_epochs, np_rng, separate_last_epoch)
        sample_idx = helpers.build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
        total = sample_idx.shape[0] - 1
        shuffle_idx = helpers.build_shuffle_idx(
            num_samples_from_full_epochs if separate_last_epoch else total, total, np_rng
        )
        for key, array in (("doc_idx", doc_idx), ("sample_idx", sample_idx), ("shuffle_idx", shuffle_idx)):
            with AtomicFile(paths[key], "wb") as f:  # a reader never sees a half-written .npy
                np.save(f, array, allow_pickle=False)
        print(
            f" > built {name} index for {data_prefix}: {total} samples over {num_epochs} epoch(s) "
            f"in {time.time() - start:.2f} s",
            flush=True,
        )

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return tuple(
        np.load(paths[key], allow_pickle=False, mmap_mode="r") for key in ("doc_idx", "sample_idx", "shuffle_idx")
    )
