"""Tokenizers from other libraries, as the two Megatron-DeepSpeed forks load them:

  PretrainedFromHF           (BigScience) --tokenizer-name-or-path DIR: transformers.AutoTokenizer;
                             vocab size len(tokenizer) (added tokens included); EOD = its eos token
  HFTokenizer                (Microsoft)  --tokenizer-model DIR: transformers.AutoTokenizer with the
                             special tokens it lacks added as the fork adds them; vocab size
                             tokenizer.vocab_size (the base vocab, added tokens excluded); EOD = eos
  GPTSentencePieceTokenizer  (Microsoft)  --tokenizer-model FILE: sentencepiece; vocab size its piece
                             count; EOD = its eos id

The libraries are optional (setup.py extras "hf" and "sentencepiece"): imported only when such a
tokenizer is asked for. Nothing is downloaded: a name that is not a local path is refused.
`vocab_size_without_torch` gives the same sizes from the files for tools/param_count.py, which
must not import torch (transformers does)."""
import json
import os
from argparse import Namespace
from collections.abc import Iterable
from types import ModuleType
from typing import Any

HF_TYPES = ("PretrainedFromHF", "HFTokenizer")
SENTENCEPIECE_TYPES = ("GPTSentencePieceTokenizer",)
# which flag names the tokenizer's files, per type (the forks' spellings)
PATH_FLAG = {"PretrainedFromHF": "--tokenizer-name-or-path", "HFTokenizer": "--tokenizer-model",
             "GPTSentencePieceTokenizer": "--tokenizer-model"}
# the special tokens Microsoft's HFTokenizer adds when a tokenizer lacks them
HF_DEFAULT_SPECIAL_TOKENS = {"pad_token": "[PAD]", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}


def tokenizer_path(args: Namespace, tokenizer_type: str) -> str:
    """The local file or directory of an external tokenizer, checked; ValueError names the flag."""
    flag = PATH_FLAG[tokenizer_type]
    path = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    if not path:
        raise ValueError(f"--tokenizer-type {tokenizer_type} needs {flag} (a local "
                         f"{'model file' if tokenizer_type in SENTENCEPIECE_TYPES else 'tokenizer directory'})")
    if not os.path.exists(path):
        raise ValueError(f"{flag} {path}: not a local file or directory; nothing is downloaded here (no network): "
                         f"save the tokenizer to a directory first (e.g. huggingface-cli download NAME "
                         f"--local-dir DIR) and pass DIR")
    if tokenizer_type in SENTENCEPIECE_TYPES and not os.path.isfile(path):
        raise ValueError(f"{flag} {path}: not a file; pass the SentencePiece .model file")
    return path


def _import(module: str, extra: str) -> ModuleType:
    try:
        return __import__(module)
    except ImportError:
        raise ValueError(f"this tokenizer needs the '{module}' package: pip install {module} "
                         f"(or pip install -e .[{extra}])") from None


class HFTokenizerWrapper:
    """A transformers tokenizer behind Megatron's tokenizer interface."""

    def __init__(self, tokenizer_type: str, path: str, trust_remote_code: bool = False) -> None:
        transformers = _import("transformers", "hf")
        transformers.utils.logging.set_verbosity_error()  # one line per rank otherwise
        self.name = tokenizer_type
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                                    local_files_only=True)
        if tokenizer_type == "HFTokenizer":
            missing = {k: v for k, v in HF_DEFAULT_SPECIAL_TOKENS.items() if getattr(self.tokenizer, k) is None}
            if missing:
                self.tokenizer.add_special_tokens(missing)
            # Microsoft's fork sizes the embedding from the base vocab; added tokens must fit in the padding
            self.vocab_size = self.tokenizer.vocab_size
        else:
            self.vocab_size = len(self.tokenizer)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"{PATH_FLAG[tokenizer_type]} {path}: the tokenizer has no eos token; it is "
                             f"needed as the end-of-document id")
        self.eod = self.tokenizer.eos_token_id

    @property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    def tokenize(self, text: str) -> list[int]:
        # as both forks call it: the tokenizer's own special-token template applies
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode(token_ids)


class SentencePieceWrapper:
    """A SentencePiece model behind Megatron's tokenizer interface (Microsoft's GPT variant:
    plain ids, no BOS / EOS added by tokenize; EOD is the model's eos)."""

    name = "GPTSentencePieceTokenizer"

    def __init__(self, path: str) -> None:
        sentencepiece = _import("sentencepiece", "sentencepiece")
        self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=path)
        self.vocab_size = self.tokenizer.get_piece_size()
        if self.tokenizer.eos_id() < 0:
            raise ValueError(f"--tokenizer-model {path}: the SentencePiece model has no eos piece (trained with "
                             f"eos_id=-1); it is needed as the end-of-document id")
        self.eod = self.tokenizer.eos_id()

    @property
    def vocab(self) -> dict[str, int]:
        return {self.tokenizer.id_to_piece(i): i for i in range(self.vocab_size)}

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: self.tokenizer.id_to_piece(i) for i in range(self.vocab_size)}

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode_as_ids(text)

    def detokenize(self, token_ids: Iterable[int]) -> str:
        return self.tokenizer.decode_ids(list(token_ids))


def build_external_tokenizer(args: Namespace, tokenizer_type: str) -> HFTokenizerWrapper | SentencePieceWrapper:
    path = tokenizer_path(args, tokenizer_type)
    if tokenizer_type in HF_TYPES:
        return HFTokenizerWrapper(tokenizer_type, path, getattr(args, "trust_remote_code", False))
    return SentencePieceWrapper(path)


def vocab_size_without_torch(args: Namespace, tokenizer_type: str) -> int:
    """The vocab size the trainer's tokenizer will report, read from the files with the
    `tokenizers` / `sentencepiece` libraries (neither imports torch). For the HF types it reads
    DIR/tokenizer.json (a fast tokenizer's one file); HFTokenizer counts the base vocab, which
    the special tokens the fork adds do not change."""
    path = tokenizer_path(args, tokenizer_type)
    flag = PATH_FLAG[tokenizer_type]
    if tokenizer_type in SENTENCEPIECE_TYPES:
        sentencepiece = _import("sentencepiece", "sentencepiece")
        return sentencepiece.SentencePieceProcessor(model_file=path).get_piece_size()
    tokenizer_json = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(tokenizer_json):
        raise ValueError(f"{flag} {path}: no tokenizer.json to count the vocab from; pass --vocab-size "
                         f"len(tokenizer) instead")
    tokenizers = _import("tokenizers", "hf")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(tokenizer_json)
    except Exception as e:  # the library's own parse error, as one line
        raise ValueError(f"{flag} {path}: {tokenizer_json} is not a tokenizers file ({e})") from None
    if tokenizer_type == "HFTokenizer":
        return tokenizer.get_vocab_size(with_added_tokens=False)
    return tokenizer.get_vocab_size(with_added_tokens=True) + len(_config_tokens_missing(path, tokenizer))


def _config_tokens_missing(path: str, tokenizer: Any) -> set[str]:
    """Tokens that the files next to tokenizer.json name but tokenizer.json lacks: transformers adds
    them on load, so len(tokenizer) counts them. As transformers 5 reads them: the special tokens of
    tokenizer_config.json (bos ... mask, additional_special_tokens, extra_special_tokens: a list or a
    dict) and its added_tokens_decoder; without an added_tokens_decoder, the legacy
    special_tokens_map.json (its entries replace the config's, its extra_special_tokens list adds to
    them) and added_tokens.json."""
    if not os.path.isdir(path):
        return set()
    config = _json_or_empty(os.path.join(path, "tokenizer_config.json"))
    named = {k: config.get(k) for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                        "cls_token", "mask_token", "additional_special_tokens")}
    extra = _token_list(config.get("extra_special_tokens"))  # a list, or (transformers 5) a dict
    added: list = []
    if "added_tokens_decoder" in config:
        added = list(config["added_tokens_decoder"].values())
    else:  # the legacy files, read only when the config carries no added_tokens_decoder
        for key, value in _json_or_empty(os.path.join(path, "special_tokens_map.json")).items():
            if key == "extra_special_tokens":
                extra += _token_list(value)
            else:
                named[key] = value
        added = list(_json_or_empty(os.path.join(path, "added_tokens.json")))
    tokens = [t for value in named.values() for t in _token_list(value)] + extra + added
    contents = {t["content"] if isinstance(t, dict) else t for t in tokens if t}
    return {t for t in contents if tokenizer.token_to_id(t) is None}


def _json_or_empty(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_list(value: Any) -> list:
    """A special-token entry as a list of tokens (strings or AddedToken dicts): one token, a list, or
    a dict of named tokens."""
    if not value:
        return []
    if isinstance(value, dict) and "content" not in value:
        return list(value.values())
    return list(value) if isinstance(value, list) else [value]
