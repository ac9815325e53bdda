"""GPT-2 byte-level BPE: exact round trips, ids identical to the `tokenizers` package, clear errors."""
import importlib.util
import json
import os
from argparse import Namespace

import pytest
from tokenizers import ByteLevelBPETokenizer

from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.gpt2_tokenization import bytes_to_unicode, read_merges

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab.json")
MERGES = os.path.join(ROOT, "data", "gpt2-merges.txt")
CORPUS = os.path.join(ROOT, "data", "corpus.jsonl")

TEXTS = [
    "",
    "Hello, world! This is a plain English sentence.",
    "Return the list of tokens; don't, can't, I'll, we've, they're, she'd, I'm.",
    "emoji 👩‍👩‍👧‍👦 family 🎉🎉 and flags 🇯🇵🇫🇷, skin tones 👍🏽",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "combining marks: e\u0301 a\u0308 o\u0302\u0323 Z\u0351\u0308\u0346a\u035bl\u0306g\u0313o\u0307",
    "whitespace   runs\t\tand tabs \u00a0nbsp\u2003em-space   ",
    "\n\nnewlines\r\nwindows\rmac\n\n\n   indented\n\tcode\n",
    "  leading and trailing spaces  ",
    "control \x00\x01\x1f\x7f bytes and ÿ þ ¡ ¬ ® latin-1",
    "العربية עברית Ελληνικά русский हिन्दी",
    "numbers 12345 3.14159 1e-10 0x1F 1,000,000",
    "def f(x):\n    return {'a': [1, 2], \"b\": x ** 2}  # comment\n",
    "<|endoftext|> is plain text here, not the special id",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² ∑∫√∞ ≠ ≤ and the replacement char \ufffd",
]


def gpt2_args(**overrides):
    args = dict(tokenizer_type=None, vocab_file=VOCAB, merge_file=MERGES, vocab_size=None)
    args.update(overrides)
    return Namespace(**args)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(gpt2_args())


@pytest.fixture(scope="module")
def reference():
    return ByteLevelBPETokenizer(VOCAB, MERGES, add_prefix_space=False)


def corpus_texts(n):
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(next(f))["text"] for _ in range(n)]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tokenizer, text):
    assert tokenizer.detokenize(tokenizer.tokenize(text)) == text


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_tokenizers_package(tokenizer, reference, text):
    assert tokenizer.tokenize(text) == reference.encode(text).ids


def test_corpus_documents_match_tokenizers_package_and_compress(tokenizer, reference):
    num_ids = num_bytes = 0
    for text in corpus_texts(40):
        ids = tokenizer.tokenize(text)
        assert ids == reference.encode(text).ids
        assert tokenizer.detokenize(ids) == text
        num_ids += len(ids)
        num_bytes += len(text.encode("utf-8"))
    # Merges are really applied: the corpus needs far fewer ids than bytes.
    assert num_ids < num_bytes / 3


def test_eod_and_vocab(tokenizer):
    with open(VOCAB, encoding="utf-8") as f:
        vocab = json.load(f)
    assert tokenizer.name == "GPT2BPETokenizer"
    assert tokenizer.vocab_size == len(vocab) == 8192  # unpadded
    assert tokenizer.eod == vocab["<|endoftext|>"] == 8191
    assert tokenizer.vocab == vocab
    assert all(tokenizer.inv_vocab[i] == token for token, i in vocab.items())


def test_bundled_files_are_in_gpt2_layout():
    with open(VOCAB, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(MERGES, encoding="utf-8") as f:
        lines = f.read().split("\n")
    # GPT-2's own loaders skip the header and drop the empty string after the final newline.
    assert lines[0] == "#version: 0.2" and lines[-1] == ""
    merges = [tuple(line.split(" ")) for line in lines[1:-1]]
    assert all(len(m) == 2 for m in merges)
    assert list(vocab)[:256] == list(bytes_to_unicode().values())
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert all(a + b in vocab for a, b in merges)


def test_bpe_merges_by_rank_left_to_right(tmp_path):
    # Tiny hand-made vocab: "aaaaa" -> (a a) twice -> (aa aa) once -> "aaaa" + "a".
    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    vocab.update({"aa": 256, "aaaa": 257, "ab": 258, "<|endoftext|>": 259})
    (tmp_path / "v.json").write_text(json.dumps(vocab))
    (tmp_path / "m.txt").write_text("#version: 0.2\na a\naa aa\na b")  # no trailing newline
    tok = build_tokenizer(gpt2_args(vocab_file=str(tmp_path / "v.json"), merge_file=str(tmp_path / "m.txt")))
    ref = ByteLevelBPETokenizer(str(tmp_path / "v.json"), str(tmp_path / "m.txt"))
    for text in ["aaaaa", "aab", "aaab", "baaa b", "a" * 9]:
        assert tok.tokenize(text) == ref.encode(text).ids
    assert tok.tokenize("aaaaa") == [257, vocab["a"]]
    assert tok.tokenize("aaab") == [256, 258]
    assert tok.eod == 259


def test_read_merges_skips_header_and_blank_lines(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("#version: 0.2\nĠ t\n\nh e\n")
    assert read_merges(str(path)) == [("Ġ", "t"), ("h", "e")]


def test_null_tokenizer():
    tok = build_tokenizer(Namespace(tokenizer_type=None, vocab_file=None, merge_file=None, vocab_size=100))
    assert tok.name == "NullTokenizer"
    assert tok.vocab_size == 100 and tok.eod == 99
    assert tok.tokenize("3 14 15 92") == [3, 14, 15, 92]
    assert tok.detokenize([3, 14, 15]) == "3 14 15"
    assert tok.vocab["42"] == 42 and tok.inv_vocab[42] == "42"


@pytest.mark.parametrize(
    "args, error, match",
    [
        (gpt2_args(vocab_file="/nonexistent/vocab.json"), FileNotFoundError, "--vocab-file /nonexistent/vocab.json"),
        (gpt2_args(merge_file="/nonexistent/merges.txt"), FileNotFoundError, "--merge-file /nonexistent/merges.txt"),
        (gpt2_args(tokenizer_type="GPT2BPETokenizer", merge_file=None), ValueError, "needs --merge-file"),
        (gpt2_args(tokenizer_type="BertWordPieceLowerCase"), ValueError,
         "--tokenizer-type 'BertWordPieceLowerCase' is not supported"),
        (gpt2_args(vocab_file=None, vocab_size=None), ValueError, "NullTokenizer needs --vocab-size"),
    ],
)
def test_bad_arguments_raise_clear_errors(args, error, match):
    with pytest.raises(error, match=match):
        build_tokenizer(args)


def test_null_tokenizer_rejects_non_ids():
    tok = build_tokenizer(Namespace(tokenizer_type="NullTokenizer", vocab_size=10))
    with pytest.raises(ValueError, match=r"'10' is not a token id in \[0, --vocab-size=10\)"):
        tok.tokenize("1 10")
    with pytest.raises(ValueError, match="'x' is not a token id"):
        tok.tokenize("x")


def test_mismatched_vocab_and_merges_are_rejected(tmp_path):
    vocab = {s: i for i, s in enumerate(bytes_to_unicode().values())}
    (tmp_path / "v.json").write_text(json.dumps(vocab))
    (tmp_path / "m.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(ValueError, match="makes 'ab', which is not in the vocab"):
        build_tokenizer(gpt2_args(vocab_file=str(tmp_path / "v.json"), merge_file=str(tmp_path / "m.txt")))
    (tmp_path / "m.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="has no <\\|endoftext\\|> token"):
        build_tokenizer(gpt2_args(vocab_file=str(tmp_path / "v.json"), merge_file=str(tmp_path / "m.txt")))
    (tmp_path / "m.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(ValueError, match="line 2: expected two space-separated symbols"):
        build_tokenizer(gpt2_args(vocab_file=str(tmp_path / "v.json"), merge_file=str(tmp_path / "m.txt")))
    (tmp_path / "v.json").write_text("{truncated")
    with pytest.raises(ValueError, match="v.json: not valid JSON .*expected a GPT-2 vocab.json"):
        build_tokenizer(gpt2_args(vocab_file=str(tmp_path / "v.json"), merge_file=str(tmp_path / "m.txt")))


def test_train_bpe_vocab_writes_loadable_gpt2_files(tmp_path):
    spec = importlib.util.spec_from_file_location("train_bpe_vocab", os.path.join(ROOT, "tools", "train_bpe_vocab.py"))
    train_bpe_vocab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_bpe_vocab)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_texts(20)))
    vocab_file, merge_file = tmp_path / "v.json", tmp_path / "m.txt"
    train_bpe_vocab.main(["--input", str(corpus), "--vocab-size", "600", "--vocab-file", str(vocab_file),
                          "--merge-file", str(merge_file)])
    tok = build_tokenizer(gpt2_args(vocab_file=str(vocab_file), merge_file=str(merge_file)))
    ref = ByteLevelBPETokenizer(str(vocab_file), str(merge_file))
    assert tok.vocab_size == 600 and tok.eod == 599
    for text in TEXTS + corpus_texts(3):
        assert tok.tokenize(text) == ref.encode(text).ids
        assert tok.detokenize(tok.tokenize(text)) == text
