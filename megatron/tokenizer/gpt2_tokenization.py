"""GPT-2 byte-level BPE, reading the GPT-2 `vocab.json` / `merges.txt` files.

Text is split with the GPT-2 pre-tokenisation regex, each piece is written as
UTF-8 bytes mapped onto printable unicode characters, and BPE merges are applied
by rank. Working on bytes means every UTF-8 string encodes and decodes exactly.
"""
import functools
import json
from collections.abc import Iterable

import regex

# GPT-2's pre-tokeniser: contractions, letter runs, digit runs, punctuation runs
# (each optionally led by one space), and whitespace that is not followed by a word.
PRETOKENIZE_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

# Enough for the distinct words of a large corpus; bounded so a long
# preprocessing run over noisy text cannot grow the cache without limit.
BPE_CACHE_SIZE = 2**18


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """Map each byte 0..255 to a printable unicode character, as GPT-2 does.

    Printable latin-1 bytes map to themselves; the rest (control characters,
    space, ...) take code points from 256 upwards so that no BPE symbol is
    whitespace or a control character. Returned in GPT-2's order: the first 256
    ids of a GPT-2 vocab are these characters in this order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = [b for b in range(256) if b not in mapping]
    for offset, b in enumerate(shifted):
        mapping[b] = chr(256 + offset)
    return mapping


def read_vocab(vocab_file: str) -> dict[str, int]:
    with open(vocab_file, encoding="utf-8") as f:
        try:
            encoder = json.load(f)
        except ValueError as e:
            raise ValueError(
                f"--vocab-file {vocab_file}: not valid JSON ({e}); expected a GPT-2 vocab.json"
            ) from None
    if not isinstance(encoder, dict):
        raise ValueError(
            f"--vocab-file {vocab_file}: expected a JSON object mapping tokens to ids (GPT-2 vocab.json format)"
        )
    return encoder


def read_merges(merges_file: str) -> list[tuple[str, ...]]:
    """Merge pairs in rank order. Accepts the '#version' header and blank lines
    of the GPT-2 file, and a missing trailing newline."""
    merges: list[tuple[str, ...]] = []
    with open(merges_file, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if (line_number == 1 and line.startswith("#version")) or not line.strip():
                continue
            pair = line.split()
            if len(pair) != 2:
                raise ValueError(
                    f"--merge-file {merges_file} line {line_number}: expected two space-separated symbols, "
                    f"got {line.rstrip()!r}"
                )
            merges.append(tuple(pair))
    return merges


class GPT2Tokenizer:
    """Byte-level BPE encoder/decoder over a GPT-2 vocab and merges file."""

    def __init__(self, vocab_file: str, merges_file: str) -> None:
        self.encoder = read_vocab(vocab_file)
        self.decoder = {i: token for token, i in self.encoder.items()}
        merges = read_merges(merges_file)
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(merges)}
        self._check_consistent(vocab_file, merges_file, merges)
        # str.translate tables between latin-1 decoded bytes and BPE symbols,
        # so the byte mapping runs in C instead of a per-byte Python loop.
        self._bytes_to_symbols = bytes_to_unicode()
        self._symbols_to_bytes = {ord(c): b for b, c in self._bytes_to_symbols.items()}
        self.bpe = functools.lru_cache(maxsize=BPE_CACHE_SIZE)(self._bpe)

    def _check_consistent(self, vocab_file: str, merges_file: str, merges: list[tuple[str, ...]]) -> None:
        # A mismatched pair of files would otherwise fail later with a bare
        # KeyError in the middle of a preprocessing run.
        for symbol in bytes_to_unicode().values():
            if symbol not in self.encoder:
                raise ValueError(
                    f"--vocab-file {vocab_file}: byte symbol {symbol!r} missing; not a byte-level GPT-2 vocab"
                )
        for first, second in merges:
            if first + second not in self.encoder:
                raise ValueError(
                    f"--merge-file {merges_file} does not match --vocab-file {vocab_file}: "
                    f"merge {first!r} {second!r} makes "
                    f"{first + second!r}, which is not in the vocab; pass the merges file trained with this vocab"
                )

    def _bpe(self, piece: str) -> tuple[str, ...]:
        """Split one byte-mapped piece into vocab symbols by applying merges in rank order."""
        word = list(piece)
        ranks = self.bpe_ranks
        while len(word) > 1:
            best = min(zip(word, word[1:], strict=False), key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            first, second = best
            merged = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return tuple(word)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in PRETOKENIZE_PATTERN.findall(text):
            symbols = piece.encode("utf-8").decode("latin-1").translate(self._bytes_to_symbols)
            ids.extend(self.encoder[symbol] for symbol in self.bpe(symbols))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        symbols = "".join(self.decoder[i] for i in ids)
        # A slice of ids may end inside a multi-byte character; replace it
        # rather than fail, as GPT-2 does.
        return symbols.translate(self._symbols_to_bytes).encode("latin-1").decode("utf-8", errors="replace")
