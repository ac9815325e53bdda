"""Train a small byte-level BPE vocab and write it as GPT-2 vocab.json + merges.txt.

The `tokenizers` package does the training; this script only reorders its
result into GPT-2's layout (the 256 byte symbols, then one token per merge in
rank order, then <|endoftext|> last) so real GPT-2 files and ours are
interchangeable for megatron/tokenizer.

Usage:
  python tools/train_bpe_vocab.py --input data/corpus.jsonl --vocab-size 8192 \
      --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt
"""
import argparse
import json
import os
from collections.abc import Iterable, Iterator, Sequence

from megatron.tokenizer.gpt2_tokenization import bytes_to_unicode
from megatron.tokenizer.tokenizer import EOD_TOKEN


def get_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a GPT-2 format byte-level BPE vocab.")
    parser.add_argument("--input", required=True, help="jsonl corpus, one JSON object per line")
    parser.add_argument("--json-key", default="text", help="key holding the text in each line")
    parser.add_argument("--vocab-size", type=int, default=8192,
                        help="size of the written vocab, <|endoftext|> included")
    parser.add_argument("--min-frequency", type=int, default=2, help="ignore pairs seen fewer times")
    parser.add_argument("--vocab-file", required=True, help="output vocab.json")
    parser.add_argument("--merge-file", required=True, help="output merges.txt")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.input):
        parser.error(f"--input {args.input} does not exist")
    if args.vocab_size < 258:
        parser.error("--vocab-size must be at least 258 (256 bytes, one merge, <|endoftext|>)")
    return args


def read_texts(path: str, key: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield json.loads(line)[key]
                except (ValueError, KeyError, TypeError) as e:
                    raise SystemExit(f"error: --input {path} line {line_number}: "
                                     f"no string {key!r} field ({e})") from None


def train_merges(texts: Iterable[str], vocab_size: int, min_frequency: int) -> list[tuple[str, ...]]:
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer(add_prefix_space=False)
    # One id is kept back for <|endoftext|>, which GPT-2 puts after the merges.
    tokenizer.train_from_iterator(texts, vocab_size=vocab_size - 1, min_frequency=min_frequency,
                                  show_progress=False)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    # Older tokenizers releases serialise a merge as "a b", newer ones as ["a", "b"].
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def gpt2_vocab(merges: Iterable[tuple[str, ...]]) -> dict[str, int]:
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    for first, second in merges:
        # Two merges can build the same string ("ab"+"c", "a"+"bc"): one id for both.
        vocab.setdefault(first + second, len(vocab))
    vocab[EOD_TOKEN] = len(vocab)
    return vocab


def main(argv: Sequence[str] | None = None) -> None:
    args = get_args(argv)
    merges = train_merges(read_texts(args.input, args.json_key), args.vocab_size, args.min_frequency)
    vocab = gpt2_vocab(merges)
    with open(args.vocab_file, "w", encoding="utf-8") as f:
        json.dump(vocab, f)
    with open(args.merge_file, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{first} {second}\n" for first, second in merges)
    print(f"wrote {len(vocab)} tokens to {args.vocab_file} and {len(merges)} merges to {args.merge_file}")


if __name__ == "__main__":
    main()
