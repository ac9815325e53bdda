"""The forks' published launch scripts (tests/data/published_scripts/*.txt) as flag lists, and
tools/param_count.py loaded to take them."""
import glob
import importlib.util
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
ROOT = os.path.dirname(HERE)
SCRIPTS = sorted(glob.glob(os.path.join(HERE, "data", "published_scripts", "*.txt")))


def with_local_tokenizer(argv, hf_tokenizer_dir, sentencepiece_model):
    """The scripts name hub tokenizers (`t5-small`, BigScience's 250k BPE) and cluster paths; nothing
    is downloaded here, so those point at the small tokenizers tests/conftest.py trains instead."""
    out = list(argv)
    for flag, path in (("--tokenizer-name-or-path", hf_tokenizer_dir), ("--tokenizer-model", sentencepiece_model)):
        if flag in out:
            out[out.index(flag) + 1] = str(path)
    return out


def load(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# source: https://github.com/"), path
    return [line for line in lines if not line.startswith("#")]


def param_count_module():
    spec = importlib.util.spec_from_file_location("param_count", os.path.join(ROOT, "tools", "param_count.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def for_the_tool(argv):
    """The scripts' cluster paths to the bundled GPT-2 files."""
    out = list(argv)
    for flag, path in (("--vocab-file", "data/gpt2-vocab.json"), ("--merge-file", "data/gpt2-merges.txt")):
        if flag in out:
            out[out.index(flag) + 1] = os.path.join(ROOT, path)
    return out
