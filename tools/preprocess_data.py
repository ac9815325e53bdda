"""Tokenize a jsonl corpus into Megatron mmap indexed datasets.

Each input line is a JSON object; for every --json-keys key the text is
tokenized into one document of {output_prefix}_{key}_document.bin/.idx.

Example:
  python tools/preprocess_data.py --input data/corpus.jsonl --output-prefix data/corpus \
      --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 2

The trainer's other tokenizers take its flags, so data and model agree (EOD is the tokenizer's eos):
  --tokenizer-type PretrainedFromHF --tokenizer-name-or-path DIR        (a local Hugging Face tokenizer)
  --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model FILE.model
"""
import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder, best_fitting_dtype, data_file_path, index_file_path
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.external import PATH_FLAG, tokenizer_path
from megatron.tokenizer.tokenizer import TOKENIZER_TYPES


def get_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tokenize a jsonl corpus into Megatron mmap indexed datasets.")
    group = parser.add_argument_group("input data")
    group.add_argument("--input", required=True, help="path to the jsonl input, one JSON object per line")
    group.add_argument("--json-keys", nargs="+", default=["text"], help="keys to extract from each JSON object")
    group.add_argument("--skip-invalid-lines", action="store_true",
                       help="warn about and skip lines that are not a JSON object with the keys as strings, "
                            "instead of stopping")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default=None,
                       help="default: GPT2BPETokenizer when --vocab-file and --merge-file are given, "
                            "else NullTokenizer")
    group.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json")
    group.add_argument("--merge-file", default=None, help="GPT-2 merges.txt")
    group.add_argument("--vocab-size", type=int, default=None, help="vocab size of NullTokenizer")
    # the trainer's spellings (megatron/config/arguments.py), so one set of tokenizer flags serves both
    group.add_argument("--tokenizer-name-or-path", default=None, help="PretrainedFromHF: a local tokenizer directory")
    group.add_argument("--tokenizer-model", default=None,
                       help="GPTSentencePieceTokenizer: the .model file; HFTokenizer: a local tokenizer directory")
    group.add_argument("--trust-remote-code", action="store_true")
    group.add_argument("--append-eod", action="store_true", help="append the end-of-document token to each document")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", required=True, help="prefix of the output files, without key or extension")
    # Accepted so Megatron command lines work unchanged; mmap is the only format written.
    group.add_argument("--dataset-impl", choices=["mmap"], default="mmap")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    group.add_argument("--log-interval", type=int, default=100, help="documents between progress lines")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.log_interval < 1:
        parser.error("--workers and --log-interval must be at least 1")
    if args.tokenizer_type in PATH_FLAG:  # checked here, before any worker starts
        try:
            tokenizer_path(args, args.tokenizer_type)
        except ValueError as e:
            parser.error(str(e))
    return args


class Encoder:
    """Tokenizes one input line; built once per worker process."""

    tokenizer: Any = None  # each worker's own, built by `initializer`

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def initializer(self) -> None:
        # The tokenizer is built in each worker rather than pickled to it.
        Encoder.tokenizer = build_tokenizer(self.args)

    def encode(self, numbered_line: tuple[int, bytes]) -> tuple[int, dict[str, np.ndarray] | None, str | None, int]:
        """(line_number, raw line) -> (line_number, {key: token array} or None, error or None, bytes)."""
        line_number, raw = numbered_line
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return line_number, None, f"not valid UTF-8 JSON ({e})", len(raw)
        if not isinstance(doc, dict):
            return line_number, None, "not a JSON object", len(raw)
        ids: dict[str, np.ndarray] = {}
        for key in self.args.json_keys:
            if not isinstance(doc.get(key), str):
                return line_number, None, f"no string field {key!r}", len(raw)
            tokens = Encoder.tokenizer.tokenize(doc[key])
            # Empty documents are dropped, so they get no end-of-document token either.
            if tokens and self.args.append_eod:
                tokens.append(Encoder.tokenizer.eod)
            ids[key] = np.array(tokens, dtype=np.int64)
        return line_number, ids, None, len(raw)


def encode_lines(
    args: argparse.Namespace, encoder: Encoder, lines: Iterable[tuple[int, bytes]],
) -> Iterator[tuple[int, dict[str, np.ndarray] | None, str | None, int]]:
    if args.workers == 1:
        # In-process: a pool would add a process and pickling for nothing.
        encoder.initializer()
        yield from map(encoder.encode, lines)
        return
    with multiprocessing.Pool(args.workers, initializer=encoder.initializer) as pool:
        yield from pool.imap(encoder.encode, lines, chunksize=32)


def output_prefix(args: argparse.Namespace, key: str) -> str:
    return f"{args.output_prefix}_{key}_document"


def main(argv: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    args = get_args(argv)
    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input} does not exist")
    output_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if not os.path.isdir(output_dir):
        raise FileNotFoundError(
            f"--output-prefix {args.output_prefix}: directory {output_dir} does not exist; create it first"
        )
    tokenizer = build_tokenizer(args)
    # ids the tokenizer adds past its vocab size (HFTokenizer's added eos) must fit the dtype too
    dtype = best_fitting_dtype(max(tokenizer.vocab_size, tokenizer.eod + 1))
    builders = {key: MMapIndexedDatasetBuilder(data_file_path(output_prefix(args, key)), dtype=dtype)
                for key in args.json_keys}
    try:
        counts = tokenize_into(args, builders)
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    for key, builder in builders.items():
        builder.finalize(index_file_path(output_prefix(args, key)))
    return counts


def tokenize_into(args: argparse.Namespace,
                  builders: dict[str, MMapIndexedDatasetBuilder]) -> dict[str, tuple[int, ...]]:
    """Feed every valid line to the builders; returns {key: (documents, tokens)}."""
    counts = {key: [0, 0] for key in builders}
    start = time.time()
    total_bytes = lines_done = skipped = 0
    input_bytes = os.path.getsize(args.input)  # what is left, for the ETA: documents vary, bytes do not lie
    with open(args.input, "rb") as fin:
        # Blank lines (e.g. a trailing one) are not documents and not errors.
        lines = ((n, line) for n, line in enumerate(fin, start=1) if line.strip())
        for line_number, ids, error, num_bytes in encode_lines(args, Encoder(args), lines):
            total_bytes += num_bytes
            if error is not None:
                if not args.skip_invalid_lines:
                    raise ValueError(
                        f"--input {args.input} line {line_number}: {error}; fix it or pass --skip-invalid-lines"
                    )
                print(f"warning: --input {args.input} line {line_number}: {error}; skipped", file=sys.stderr)
                skipped += 1
                continue
            for key, tokens in ids.items():
                if len(tokens):
                    builders[key].add_item(tokens)
                    builders[key].end_document()
                    counts[key][0] += 1
                    counts[key][1] += len(tokens)
            lines_done += 1
            if lines_done % args.log_interval == 0:
                report_progress(lines_done, total_bytes, start, input_bytes)
    for key, (documents, _) in counts.items():
        if documents == 0:
            raise ValueError(
                f"--input {args.input} has no documents with tokens under key {key!r}; check the file and --json-keys"
            )
    report_progress(lines_done, total_bytes, start, input_bytes)
    for key, (documents, num_tokens) in counts.items():
        print(f"{output_prefix(args, key)}: {documents} documents, {num_tokens} tokens"
              + (f" ({skipped} invalid lines skipped)" if skipped else ""), file=sys.stderr)
    return {key: tuple(c) for key, c in counts.items()}


def report_progress(documents: int, num_bytes: int, start: float, input_bytes: int) -> None:
    """Every --log-interval documents: the rates, the share of the input read and an ETA at the rate so far."""
    elapsed = max(time.time() - start, 1e-9)
    done = min(num_bytes / max(input_bytes, 1), 1.0)  # blank lines are not counted: at most a few bytes short
    eta = elapsed * (1 - done) / done if done > 0 else 0.0
    print(f"Processed {documents} documents ({documents / elapsed:.1f} docs/s, "
          f"{num_bytes / elapsed / 2**20:.2f} MB/s); "
          f"{num_bytes / 2**20:.2f} of {input_bytes / 2**20:.2f} MB ({100 * done:.1f}%), elapsed {_clock(elapsed)}, "
          f"ETA {_clock(eta)}.", file=sys.stderr)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:  # bad input: one line, not a traceback
        sys.exit(f"error: {e}")
