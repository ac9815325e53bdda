import os
import subprocess
import sys

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported anywhere
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def pytest_configure(config):
    config.addinivalue_line("markers", "unit: fast, in-process (tests/unit/): `python -m pytest -q -m unit tests`")
    config.addinivalue_line("markers", "integration: real multi-process launches (tests/integration/)")


def pytest_collection_modifyitems(config, items):
    """Each test is marked by its folder, so `-m unit` runs the fast part alone."""
    for item in items:
        kind = os.path.basename(os.path.dirname(str(item.path)))
        if kind in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture
def entry_point(monkeypatch, capsys):
    """Runs pretrain_gpt.main(flags) in this process; returns (exit code, stderr lines, builds).
    Rules checked after torch.distributed started (tokenizer, checkpoint) get a world of one on a
    free port, torn down afterwards."""
    import deepspeed
    import torch

    import pretrain_gpt
    from tests.support.launch import free_port

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    builds = []
    refusing = []  # non-empty while run() waits for a refusal: a build then is the failure, at once
    provider = pretrain_gpt.model_provider

    def model_provider(args):
        builds.append(args)
        if refusing:
            raise AssertionError("the model was built before the error (a rule is missing)")
        return provider(args)
    monkeypatch.setattr(pretrain_gpt, "model_provider", model_provider)

    def init_without_the_other_ranks(*args, **kwargs):
        raise AssertionError("torch.distributed was started before the error (a rule is missing)")

    def run(args_list, world_size=1):
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        if world_size > 1:  # only rank 0 runs here: with a rule missing, init would wait for the others
            monkeypatch.setattr(deepspeed, "init_distributed", init_without_the_other_ranks)
        refusing.append(True)
        try:
            with pytest.raises(SystemExit) as exit_info:
                pretrain_gpt.main(args_list)
        finally:
            refusing.clear()
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        return exit_info.value.code, err.splitlines(), builds

    yield run
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The bundled corpus, preprocessed the way the quickstart does (once per test session)."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, "tools/preprocess_data.py", "--input", "data/corpus.jsonl",
                    "--output-prefix", str(out / "corpus"), "--vocab-file", "data/gpt2-vocab.json",
                    "--merge-file", "data/gpt2-merges.txt", "--append-eod", "--workers", "1"],
                   cwd=ROOT, check=True, capture_output=True)
    return str(out / "corpus_text_document")


def _corpus_texts():
    import json
    with open(os.path.join(ROOT, "data", "corpus.jsonl"), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


HF_TOKENIZER_SIZE = 300  # byte-level BPE: 256 bytes + <|endoftext|> + 43 merges
SENTENCEPIECE_SIZE = 320


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory):
    """A Hugging Face fast tokenizer trained on the bundled corpus with the `tokenizers` library
    and saved as transformers saves one (loadable with AutoTokenizer from the directory)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=HF_TOKENIZER_SIZE, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus_texts(), trainer=trainer)
    assert tok.get_vocab_size() == HF_TOKENIZER_SIZE
    out = tmp_path_factory.mktemp("hf_tokenizer")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def sentencepiece_model(tmp_path_factory):
    """A SentencePiece BPE model trained on the bundled corpus (ids 0-3: pad, unk, bos, eos)."""
    spm = pytest.importorskip("sentencepiece")
    out = tmp_path_factory.mktemp("sentencepiece")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus_texts()), model_prefix=str(out / "sp"),
                                   vocab_size=SENTENCEPIECE_SIZE, model_type="bpe", pad_id=0, unk_id=1, bos_id=2,
                                   eos_id=3, minloglevel=2, num_threads=1)
    return str(out / "sp.model")
