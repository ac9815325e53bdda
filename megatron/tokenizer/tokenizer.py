"""Megatron tokenizers: build one from the command-line arguments."""
import os
from argparse import Namespace
from collections.abc import Iterable

from .external import HF_TYPES, SENTENCEPIECE_TYPES, HFTokenizerWrapper, SentencePieceWrapper, build_external_tokenizer
from .gpt2_tokenization import GPT2Tokenizer

EOD_TOKEN = "<|endoftext|>"
TOKENIZER_TYPES = ("GPT2BPETokenizer", "NullTokenizer") + HF_TYPES + SENTENCEPIECE_TYPES


def build_tokenizer(
    args: Namespace,
) -> "_GPT2BPETokenizer | _NullTokenizer | HFTokenizerWrapper | SentencePieceWrapper":
    """Tokenizer named by args.tokenizer_type; the vocab is left unpadded.

    With no --tokenizer-type, GPT2BPETokenizer is used when --vocab-file and
    --merge-file are both given, NullTokenizer otherwise. The Hugging Face and
    SentencePiece types load their optional library only when asked for.
    """
    vocab_file = getattr(args, "vocab_file", None)
    merge_file = getattr(args, "merge_file", None)
    tokenizer_type = getattr(args, "tokenizer_type", None)
    if tokenizer_type is None:
        tokenizer_type = "GPT2BPETokenizer" if vocab_file and merge_file else "NullTokenizer"
    if tokenizer_type == "GPT2BPETokenizer":
        return _GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "NullTokenizer":
        return _NullTokenizer(getattr(args, "vocab_size", None))
    if tokenizer_type in HF_TYPES + SENTENCEPIECE_TYPES:
        return build_external_tokenizer(args, tokenizer_type)
    raise ValueError(
        f"--tokenizer-type {tokenizer_type!r} is not supported; use one of {', '.join(TOKENIZER_TYPES)}"
    )


def _require_file(flag: str, path: str | None) -> None:
    if not path:
        raise ValueError(
            f"GPT2BPETokenizer needs {flag}; pass the GPT-2 format file "
            f"(e.g. data/gpt2-vocab.json, data/gpt2-merges.txt)"
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{flag} {path} does not exist; pass an existing GPT-2 format file (e.g. the one in data/)"
        )


class _GPT2BPETokenizer:
    """GPT-2 byte-level BPE; end of document is the vocab's <|endoftext|>."""

    name = "GPT2BPETokenizer"

    def __init__(self, vocab_file: str | None, merge_file: str | None) -> None:
        _require_file("--vocab-file", vocab_file)
        _require_file("--merge-file", merge_file)
        self.tokenizer = GPT2Tokenizer(vocab_file, merge_file)
        if EOD_TOKEN not in self.tokenizer.encoder:
            raise ValueError(
                f"--vocab-file {vocab_file} has no {EOD_TOKEN} token; it is needed as the end-of-document id"
            )
        self.eod_id = self.tokenizer.encoder[EOD_TOKEN]

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer.encoder)

    @property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.encoder

    @property
    def inv_vocab(self) -> dict[int, str]:
        return self.tokenizer.decoder

    @property
    def eod(self) -> int:
        return self.eod_id

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode(token_ids)


class _NullTokenizer:
    """Text is already token ids, written as space-separated integers.

    Useful for synthetic data and benchmarks; the last id is end of document.
    """

    name = "NullTokenizer"

    def __init__(self, vocab_size: int | None) -> None:
        if vocab_size is None or int(vocab_size) < 2:
            raise ValueError(
                "NullTokenizer needs --vocab-size of at least 2 "
                "(or pass --vocab-file and --merge-file to use GPT2BPETokenizer)"
            )
        self.vocab_size = int(vocab_size)
        self.eod = self.vocab_size - 1

    @property
    def vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(self.vocab_size)}

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: str(i) for i in range(self.vocab_size)}

    def tokenize(self, text: str) -> list[int]:
        ids = []
        for token in text.split():
            if not token.isdigit() or int(token) >= self.vocab_size:
                raise ValueError(
                    f"NullTokenizer: {token!r} is not a token id in [0, --vocab-size={self.vocab_size})"
                )
            ids.append(int(token))
        return ids

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return " ".join(str(i) for i in token_ids)
