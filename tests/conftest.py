import os
import subprocess
import sys

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported anywhere
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The bundled corpus, preprocessed the way the quickstart does (once per test session)."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, "tools/preprocess_data.py", "--input", "data/corpus.jsonl",
                    "--output-prefix", str(out / "corpus"), "--vocab-file", "data/gpt2-vocab.json",
                    "--merge-file", "data/gpt2-merges.txt", "--append-eod", "--workers", "1"],
                   cwd=ROOT, check=True, capture_output=True)
    return str(out / "corpus_text_document")
