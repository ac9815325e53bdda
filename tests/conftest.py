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
