"""tools/*.py scripts as importable modules, each loaded once per process: a second load would
make a new class of the same name, and `--workers` could no longer pickle the first one's
objects (preprocess_data's Encoder)."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(name):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def preprocess(tmp_path, *tokenizer_flags):
    """The bundled corpus through tools/preprocess_data.py with `tokenizer_flags`; the dataset prefix."""
    load_tool("preprocess_data").main(["--input", os.path.join(ROOT, "data", "corpus.jsonl"), "--output-prefix",
                                       str(tmp_path / "corpus"), "--append-eod", *map(str, tokenizer_flags)])
    return str(tmp_path / "corpus_text_document")
