"""Vectorised numpy builders for the GPT and blending index arrays.

Megatron builds these in C++ (helpers.cpp) with per-sample loops; the same
results come from cumulative sums and searchsorted, which numpy runs in C, so
no compiled extension is needed and 100M+ token corpora index in seconds.
"""
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs whose concatenation yields num_samples windows of seq_length+1 tokens.

    Consecutive samples share one token, so E epochs give (E*T - 1) // L samples;
    solving (E*T - 1) // L >= N for E gives the closed form below.
    """
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def build_doc_idx(documents: npt.ArrayLike, num_epochs: int, np_rng: np.random.RandomState,
                  separate_last_epoch: bool) -> np.ndarray:
    """Document ids for num_epochs passes, each shuffled with np_rng.

    With separate_last_epoch the last pass is shuffled on its own, so the
    (partly used) last epoch does not mix into the earlier ones and every
    document of the full epochs is seen before any repeats.
    """
    if not separate_last_epoch or num_epochs == 1:
        doc_idx = np.tile(np.asarray(documents, dtype=np.int64), num_epochs)
        np_rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, num_epochs - 1, np_rng, False)
    last = build_doc_idx(documents, 1, np_rng, False)
    return np.concatenate((first, last))


def build_sample_idx(sizes: npt.ArrayLike, doc_idx: np.ndarray, seq_length: int, num_epochs: int,
                     tokens_per_epoch: int) -> np.ndarray:
    """[num_samples + 1, 2] (index into doc_idx, token offset) of each sample start.

    Sample i covers tokens i*L .. i*L + L (inclusive) of the concatenated
    documents, so the end of sample i is the start of sample i+1. Row 0 is
    (0, 0); every later row names the document holding position k*L, which is
    what Megatron's C++ loop produces.
    """
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    doc_lengths = np.asarray(sizes)[doc_idx].astype(np.int64)
    doc_ends = np.cumsum(doc_lengths)
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    # side="right": a position equal to a document's end belongs to the next
    # document; empty documents (end == start) are thereby skipped.
    docs = np.searchsorted(doc_ends, positions, side="right")
    offsets = positions - (doc_ends[docs] - doc_lengths[docs])
    sample_idx = np.stack((docs, offsets), axis=1)
    sample_idx[0] = 0
    return sample_idx


def build_shuffle_idx(num_samples: int, total_size: int, np_rng: np.random.RandomState) -> np.ndarray:
    """Permutation of range(total_size): the first num_samples shuffled among
    themselves, the rest (from a separate last epoch) likewise."""
    first = np.arange(num_samples, dtype=np.int64)
    np_rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=np.int64)
    np_rng.shuffle(last)
    return np.concatenate((first, last))


def build_blending_indices(weights: npt.ArrayLike, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index) of `size` samples drawn from datasets by weight.

    Dataset i's n-th sample gets the key (n + 0.5) / w_i and the `size` smallest
    keys are taken in order (ties go to the lower dataset index). This is the
    Sainte-Laguë/Webster apportionment run sample by sample: every prefix of
    the result holds each dataset within one sample of its weighted share.
    """
    weights = np.asarray(weights, dtype=np.float64)
    # A dataset never gets more than w_i * (size + n/2) + 1/2 samples, so these
    # keys are enough (+2 guards against rounding).
    max_per_dataset = np.ceil(weights * (size + len(weights) / 2) + 0.5).astype(np.int64) + 2
    dataset = np.repeat(np.arange(len(weights), dtype=np.int64), max_per_dataset)
    sample = np.concatenate([np.arange(n, dtype=np.int64) for n in max_per_dataset])
    with np.errstate(divide="ignore"):
        keys = (sample + 0.5) / weights[dataset]
    order = np.lexsort((dataset, keys))[:size]
    return dataset[order], sample[order]


def build_sample_idx_loop(sizes: Sequence[int] | np.ndarray, doc_idx: Sequence[int] | np.ndarray, seq_length: int,
                          num_epochs: int, tokens_per_epoch: int) -> np.ndarray:
    """Megatron's C++ build_sample_idx transcribed line by line: the reference that
    build_sample_idx must equal (tests) and beat (benchmarks/bench_data.py)."""
    sizes, doc_idx = np.asarray(sizes).tolist(), np.asarray(doc_idx).tolist()  # fastest plain-Python form
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
    doc_idx_index = doc_offset = 0
    for sample_index in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = sizes[doc_idx[doc_idx_index]] - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index] = doc_idx_index, doc_offset
    return sample_idx
