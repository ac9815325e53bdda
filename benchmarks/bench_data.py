"""Data-pipeline throughput: GPT index building on a synthetic corpus, and preprocessing.

Writes a synthetic corpus of --tokens random tokens (random document lengths)
with the indexed-dataset builder, times each GPT index stage, compares the
vectorised sample_idx builder with a plain Python loop (Megatron's C++
algorithm) on a slice, and times tools/preprocess_data.py on data/corpus.jsonl.

Usage: python benchmarks/bench_data.py [--tokens 100000000] [--seq-length 2048]
"""
import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from megatron.data import helpers
from megatron.data.gpt_dataset import GPTDataset
from megatron.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000_000, help="size of the synthetic corpus")
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--reference-tokens", type=int, default=10_000_000,
                        help="slice compared against the Python loop")
    parser.add_argument("--workdir", default=None,
                        help="where to write the corpus (default: a temporary directory, removed after)")
    return parser.parse_args()


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def write_synthetic_corpus(prefix: str, num_tokens: int, rng: np.random.RandomState) -> int:
    # Lengths around 1000 tokens, like web documents; a few empty ones as real data has.
    lengths = rng.randint(0, 2000, size=num_tokens // 1000 + 1000)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), num_tokens) + 1]
    tokens = np.memmap(prefix + ".tokens", dtype=np.uint16, mode="w+", shape=(int(lengths.sum()),))
    tokens[:] = rng.randint(0, 50257, size=tokens.shape, dtype=np.uint16)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    ends = np.cumsum(lengths)
    for start, end in zip(ends - lengths, ends, strict=True):
        builder.add_item(tokens[start:end])
        builder.end_document()
    builder.finalize(prefix + ".idx")
    del tokens
    os.remove(prefix + ".tokens")
    return int(lengths.sum())


def bench_index(rows: list[tuple[str, int, float, float | None]], workdir: str, num_tokens: int, seq_length: int,
                reference_tokens: int) -> None:
    prefix = os.path.join(workdir, "synthetic")
    rng = np.random.RandomState(0)
    num_tokens, seconds = timed(write_synthetic_corpus, prefix, num_tokens, rng)
    rows.append(("write corpus with builder", num_tokens, seconds, None))

    indexed = MMapIndexedDataset(prefix)
    sizes = indexed.sizes
    documents = np.arange(len(sizes))
    num_samples = (num_tokens - 1) // seq_length  # one epoch
    doc_idx, seconds = timed(helpers.build_doc_idx, documents, 1, np.random.RandomState(1), False)
    rows.append(("doc_idx (1 epoch)", num_tokens, seconds, None))
    sample_idx, seconds = timed(helpers.build_sample_idx, sizes, doc_idx, seq_length, 1, num_tokens)
    rows.append((f"sample_idx (seq {seq_length})", num_tokens, seconds, None))
    _, seconds = timed(helpers.build_shuffle_idx, len(sample_idx) - 1, len(sample_idx) - 1, np.random.RandomState(1))
    rows.append(("shuffle_idx", num_tokens, seconds, None))
    _, seconds = timed(GPTDataset, "train", prefix, documents, indexed, num_samples, seq_length, 1234)
    rows.append(("GPTDataset build + save", num_tokens, seconds, None))
    _, seconds = timed(GPTDataset, "train", prefix, documents, indexed, num_samples, seq_length, 1234)
    rows.append(("GPTDataset load from cache", num_tokens, seconds, None))

    # Same inputs for both builders: the first documents covering reference_tokens.
    num_docs = int(np.searchsorted(np.cumsum(sizes, dtype=np.int64), reference_tokens)) + 1
    slice_docs = np.arange(num_docs)
    slice_tokens = int(sizes[:num_docs].sum(dtype=np.int64))
    slice_seq = 128  # short samples: the loop's worst case is many samples
    slice_doc_idx = helpers.build_doc_idx(slice_docs, 1, np.random.RandomState(1), False)
    expected, loop_seconds = timed(helpers.build_sample_idx_loop, sizes, slice_doc_idx, slice_seq, 1, slice_tokens)
    got, vector_seconds = timed(helpers.build_sample_idx, sizes, slice_doc_idx, slice_seq, 1, slice_tokens)
    assert np.array_equal(expected, got), "vectorised sample_idx differs from the loop reference"
    rows.append((f"sample_idx Python loop (seq {slice_seq})", slice_tokens, loop_seconds, 1.0))
    rows.append((f"sample_idx vectorised (seq {slice_seq})", slice_tokens, vector_seconds,
                 loop_seconds / vector_seconds))


def bench_preprocess(rows: list[tuple[str, int, float, float | None]], workdir: str) -> None:
    spec = importlib.util.spec_from_file_location("preprocess_data", os.path.join(ROOT, "tools", "preprocess_data.py"))
    preprocess_data = importlib.util.module_from_spec(spec)
    sys.modules["preprocess_data"] = preprocess_data  # lets the worker pool pickle its Encoder
    spec.loader.exec_module(preprocess_data)
    for workers in (1, 2):
        argv = ["--input", os.path.join(ROOT, "data", "corpus.jsonl"),
                "--output-prefix", os.path.join(workdir, f"corpus{workers}"),
                "--vocab-file", os.path.join(ROOT, "data", "gpt2-vocab.json"),
                "--merge-file", os.path.join(ROOT, "data", "gpt2-merges.txt"),
                "--append-eod", "--workers", str(workers), "--log-interval", "1000000"]
        with contextlib.redirect_stderr(io.StringIO()):
            counts, seconds = timed(preprocess_data.main, argv)
        rows.append((f"preprocess_data.py --workers {workers}", counts["text"][1], seconds, None))


def main() -> None:
    args = get_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_data_")
    rows: list[tuple[str, int, float, float | None]] = []
    try:
        bench_index(rows, workdir, args.tokens, args.seq_length, args.reference_tokens)
        bench_preprocess(rows, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir)
    print(f"{'stage':<36}{'tokens':>14}{'seconds':>10}{'tokens/s':>14}{'speedup':>9}")
    for stage, tokens, seconds, ratio in rows:
        speedup = f"{ratio:>8.0f}x" if ratio is not None else ""
        print(f"{stage:<36}{tokens:>14,}{seconds:>10.3f}{tokens / seconds:>14.3g}{speedup}")


if __name__ == "__main__":
    main()
