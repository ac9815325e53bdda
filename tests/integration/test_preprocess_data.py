"""tools/preprocess_data.py: jsonl -> .bin/.idx holding exactly the tokenized documents."""
import filecmp
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from megatron.data.gpt_dataset import build_train_valid_test_datasets
from megatron.data.indexed_dataset import MMapIndexedDataset, dataset_exists
from megatron.tokenizer import build_tokenizer
from tests.support.tool_modules import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab.json")
MERGES = os.path.join(ROOT, "data", "gpt2-merges.txt")
SCRIPT = os.path.join(ROOT, "tools", "preprocess_data.py")

preprocess_data = load_tool("preprocess_data")

DOCS = [
    {"text": "Return the number of items in a container.", "title": "len"},
    {"text": "", "title": "an empty text is dropped"},
    {"text": "Unicode: naïve café, 日本語, emoji 🎉\n\nand   spaces.", "title": "unicode"},
    {"text": "x", "title": "one"},
    {"text": "Open file and return a stream.  Raise OSError upon failure.\n" * 5, "title": "open"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(preprocess_data.get_args(["--input", "x", "--output-prefix", "y", "--vocab-file", VOCAB,
                                                     "--merge-file", MERGES]))


def write_jsonl(path, rows):
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return str(path)


def run(tmp_path, input_path, *extra, prefix="out"):
    argv = ["--input", input_path, "--output-prefix", str(tmp_path / prefix), "--vocab-file", VOCAB,
            "--merge-file", MERGES, *extra]
    return preprocess_data.main(argv)


def expected_documents(tokenizer, texts, append_eod):
    docs = [tokenizer.tokenize(t) + ([tokenizer.eod] if append_eod else []) for t in texts]
    return [d for d in docs if len(d) > int(append_eod)]


@pytest.mark.parametrize("append_eod", [True, False])
def test_dataset_holds_exactly_the_tokenized_documents(tmp_path, tokenizer, append_eod):
    counts = run(tmp_path, write_jsonl(tmp_path / "in.jsonl", DOCS), *(["--append-eod"] if append_eod else []))
    expected = expected_documents(tokenizer, [d["text"] for d in DOCS], append_eod)
    ds = MMapIndexedDataset(str(tmp_path / "out_text_document"))
    assert ds.dtype == np.uint16  # vocab of 8192 < 65500
    assert counts == {"text": (4, sum(map(len, expected)))}
    assert [ds[i].tolist() for i in range(len(ds))] == expected
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert tokenizer.detokenize(ds[1].tolist()).startswith(DOCS[2]["text"])


def test_preprocess_then_gpt_dataset_yields_the_document_stream(tmp_path, tokenizer):
    texts = [f"Document number {i} says {'hello ' * (i % 7)}and ends." for i in range(30)]
    run(tmp_path, write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts]), "--append-eod")
    prefix = str(tmp_path / "out_text_document")
    seq_length = 12
    train, _, _ = build_train_valid_test_datasets([prefix], "mmap", "1,0,0", [50, 0, 0], seq_length, 1234, True)
    documents = expected_documents(tokenizer, texts, True)
    stream = np.concatenate([documents[d] for d in train.doc_idx])
    assert stream[-1] == tokenizer.eod
    for position, k in enumerate(train.shuffle_idx):  # undo the shuffle through shuffle_idx
        np.testing.assert_array_equal(train[position]["text"], stream[k * seq_length: (k + 1) * seq_length + 1])


def test_workers_give_identical_files(tmp_path):
    rows = [{"text": f"{d['text']} #{i}"} for i in range(40) for d in DOCS]
    input_path = write_jsonl(tmp_path / "in.jsonl", rows)
    run(tmp_path, input_path, "--append-eod", "--workers", "1", prefix="one")
    run(tmp_path, input_path, "--append-eod", "--workers", "2", prefix="two")
    for ext in (".bin", ".idx"):
        assert filecmp.cmp(tmp_path / f"one_text_document{ext}", tmp_path / f"two_text_document{ext}", shallow=False)


def test_several_json_keys(tmp_path, tokenizer):
    run(tmp_path, write_jsonl(tmp_path / "in.jsonl", DOCS), "--json-keys", "text", "title")
    titles = MMapIndexedDataset(str(tmp_path / "out_title_document"))
    assert [titles[i].tolist() for i in range(len(titles))] == [tokenizer.tokenize(d["title"]) for d in DOCS]
    assert len(MMapIndexedDataset(str(tmp_path / "out_text_document"))) == 4


def test_null_tokenizer_and_wide_dtype(tmp_path):
    input_path = write_jsonl(tmp_path / "in.jsonl", [{"text": "1 2 3"}, {"text": "69999 0"}])
    preprocess_data.main(["--input", input_path, "--output-prefix", str(tmp_path / "out"),
                          "--tokenizer-type", "NullTokenizer", "--vocab-size", "70000", "--append-eod"])
    ds = MMapIndexedDataset(str(tmp_path / "out_text_document"))
    assert ds.dtype == np.int32  # 70000 ids do not fit uint16
    assert [ds[0].tolist(), ds[1].tolist()] == [[1, 2, 3, 69999], [69999, 0, 69999]]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_invalid_line_stops_with_file_and_line_and_leaves_no_files(tmp_path, workers):
    rows = [DOCS[0], "\n", "{not json\n", DOCS[3]]  # the blank line 2 is not an error
    input_path = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(ValueError,
                       match=rf"--input {input_path} line 3: not valid UTF-8 JSON .*pass --skip-invalid-lines"):
        run(tmp_path, input_path, "--workers", workers)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


@pytest.mark.parametrize("line, reason", [('["a list"]\n', "not a JSON object"),
                                          ('{"txt": "typo"}\n', "no string field 'text'"),
                                          ('{"text": 5}\n', "no string field 'text'"),
                                          (b'{"text": "\xff"}\n', "not valid UTF-8")])
def test_invalid_lines_are_skipped_with_a_warning(tmp_path, tokenizer, capsys, line, reason):
    input_path = tmp_path / "in.jsonl"
    input_path.write_bytes(b"".join([json.dumps(DOCS[0]).encode() + b"\n",
                                     line if isinstance(line, bytes) else line.encode(),
                                     json.dumps(DOCS[3]).encode() + b"\n"]))
    run(tmp_path, str(input_path), "--skip-invalid-lines")
    assert f"warning: --input {input_path} line 2: {reason}" in capsys.readouterr().err
    ds = MMapIndexedDataset(str(tmp_path / "out_text_document"))
    assert [ds[0].tolist(), ds[1].tolist()] == [tokenizer.tokenize(DOCS[0]["text"]),
                                                tokenizer.tokenize(DOCS[3]["text"])]


def test_failed_run_keeps_the_previous_dataset(tmp_path):
    prefix = str(tmp_path / "out_text_document")
    run(tmp_path, write_jsonl(tmp_path / "good.jsonl", DOCS))
    before = [open(prefix + ext, "rb").read() for ext in (".bin", ".idx")]
    with pytest.raises(ValueError, match="line 2"):
        run(tmp_path, write_jsonl(tmp_path / "bad.jsonl", [DOCS[0], "oops\n"]))
    assert [open(prefix + ext, "rb").read() for ext in (".bin", ".idx")] == before
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "good.jsonl", "out_text_document.bin", "out_text_document.idx"]


def test_missing_input_empty_corpus_and_missing_vocab(tmp_path):
    with pytest.raises(FileNotFoundError, match="--input /nonexistent.jsonl does not exist"):
        run(tmp_path, "/nonexistent.jsonl")
    for rows in ([], [{"text": ""}, "\n", {"text": ""}]):
        with pytest.raises(ValueError, match="has no documents with tokens under key 'text'"):
            run(tmp_path, write_jsonl(tmp_path / "empty.jsonl", rows))
    assert not dataset_exists(str(tmp_path / "out_text_document"))
    with pytest.raises(FileNotFoundError, match="--vocab-file /nonexistent/vocab.json does not exist"):
        preprocess_data.main(["--input", str(tmp_path / "empty.jsonl"), "--output-prefix", str(tmp_path / "o"),
                              "--vocab-file", "/nonexistent/vocab.json", "--merge-file", MERGES])
    with pytest.raises(FileNotFoundError, match="--output-prefix .*/no/such/dir/out: directory .* does not exist"):
        run(tmp_path, write_jsonl(tmp_path / "in.jsonl", DOCS), prefix="no/such/dir/out")


def test_command_line_progress_and_one_line_errors(tmp_path):
    input_path = write_jsonl(tmp_path / "in.jsonl", DOCS * 3)
    common = [sys.executable, SCRIPT, "--output-prefix", str(tmp_path / "out"), "--vocab-file", VOCAB,
              "--merge-file", MERGES]
    ok = subprocess.run(common + ["--input", input_path, "--log-interval", "5"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "Processed 5 documents (" in ok.stderr and "docs/s" in ok.stderr and "MB/s" in ok.stderr
    bad = subprocess.run(common + ["--input", str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr == f"error: --input {tmp_path / 'missing.jsonl'} does not exist\n"
