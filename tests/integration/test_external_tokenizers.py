"""Hugging Face and SentencePiece tokenizers end to end: the bundled corpus preprocessed with a
small tokenizer of each kind (trained in tests/conftest.py), the ids checked against the library
itself, a real launch on that data with the exact count worked out by hand, tools/param_count.py
reading the tokenizer's size without torch, and the export. The HF run also pads the vocab with
--pad-vocab-size-to at TP=2; the SentencePiece run uses --rotary-percent and is checked against
transformers' GPT-NeoX (its partial_rotary_factor) after the export."""
import json
import os
import subprocess
import sys

import pytest
import torch

from megatron.data.indexed_dataset import MMapIndexedDataset
from tests.conftest import HF_TOKENIZER_SIZE, ROOT, SENTENCEPIECE_SIZE, _corpus_texts
from tests.support.distributed import run_distributed
from tests.support.flag_runs import flags as trainer_flags
from tests.support.hf_export import convert, our_logits
from tests.support.launcher import launch, losses
from tests.support.tool_modules import load_tool, preprocess

ITERS = 4
# GPT-2-like tiny model; L=2, h=64, a=4, s=32
MODEL = ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
         "--max-position-embeddings", 32]
TRAIN = ["--micro-batch-size", 2, "--global-batch-size", 4, "--train-iters", ITERS, "--lr", "3e-3",
         "--lr-warmup-iters", 1, "--hidden-dropout", 0, "--attention-dropout", 0, "--log-interval", 1,
         "--eval-interval", 1000, "--eval-iters", 1, "--seed", 1234, "--split", "98,2,0"]



def check_ids(prefix, encode, eos):
    """Every document preprocess_data wrote is the library's own encoding of that text + eos."""
    docs = MMapIndexedDataset(prefix)
    texts = [t for t in _corpus_texts() if encode(t)]
    assert len(docs) == len(texts) > 400
    for i in range(0, len(texts), 7):  # every 7th document: the whole corpus takes seconds per tokenizer
        assert docs[i].tolist() == encode(texts[i]) + [eos], f"document {i}"


def param_count_tool(*flags):
    proc = subprocess.run([sys.executable, "tools/param_count.py", *map(str, flags)], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    return proc


def tiny_per_layer(h=64):
    return 12 * h * h + 13 * h  # QKV 3h^2+3h, dense h^2+h, MLP 8h^2+5h, two LayerNorms 4h


def test_hf_tokenizer_padded_vocab_tp2_launch_count_and_export(tmp_path, hf_tokenizer_dir):
    from tokenizers import Tokenizer
    reference = Tokenizer.from_file(os.path.join(hf_tokenizer_dir, "tokenizer.json"))  # not transformers
    eos = reference.token_to_id("<|endoftext|>")
    prefix = preprocess(tmp_path, "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", hf_tokenizer_dir)
    check_ids(prefix, lambda t: reference.encode(t).ids, eos)

    # 300 tokens padded to exactly 320 (a multiple of 64 and of TP 2; the default would pad to 512)
    tokenizer = ["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", hf_tokenizer_dir,
                 "--pad-vocab-size-to", 320, "--make-vocab-size-divisible-by", 64]
    padded, h, s = 320, 64, 32
    expected = padded * h + s * h + 2 * tiny_per_layer() + 2 * h  # word + position tables, layers, final LN
    assert expected == 122_624
    ckpt = tmp_path / "ckpt"
    flags = MODEL + TRAIN + tokenizer + ["--data-path", prefix, "--tensor-model-parallel-size", 2,
                                         "--save", ckpt, "--save-interval", ITERS]
    tool = subprocess.Popen([sys.executable, "tools/param_count.py", *map(str, flags)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    proc, ranks = launch(2, flags, str(tmp_path / "run"))
    out = tool.communicate(timeout=120)[0]
    assert tool.returncode == 0
    assert f"parameters: {expected:,}\n" in out
    assert f"padded vocab size: 320 (vocab {HF_TOKENIZER_SIZE}, --pad-vocab-size-to 320)" in out
    assert [r["parameters"] for r in ranks.values()] == [expected, expected]
    assert f"model parameters (exact): {expected:,} total" in proc.stdout
    curve = losses(proc.stdout)
    assert sorted(curve) == list(range(1, ITERS + 1)) and curve[ITERS] < curve[1], curve

    # the TP=2 shards merge to the padded 320 rows; the export keeps them and the tokenizer
    from megatron.checkpoint.reshard import Checkpoint
    assert tuple(Checkpoint(str(ckpt)).read_weights([0])[(0, "word_embeddings.weight")].shape) == (padded, h)
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    export = convert("--load", ckpt, "--output", tmp_path / "hf")
    assert export.returncode == 0, export.stderr
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert (model.config.vocab_size, model.num_parameters()) == (padded, expected)
    exported = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert exported.encode("def main():") == reference.encode("def main():").ids
    assert model.config.eos_token_id == eos


def _partial_rotary_reference(x, r, theta=10000.0):
    """Plain rotation of channel pairs (j, j + r/2), j < r/2, by angle p * theta^(-2j/r); the
    channels from r on are left as they are."""
    b, heads, s, d = x.shape
    out = x.clone()
    for j in range(r // 2):
        angle = torch.arange(s, dtype=torch.float64) * theta ** (-2 * j / r)
        c, sn = angle.cos(), angle.sin()
        a, bb = x[..., j].double(), x[..., j + r // 2].double()
        out[..., j] = (a * c - bb * sn).to(x.dtype)
        out[..., j + r // 2] = (bb * c + a * sn).to(x.dtype)
    return out


def test_partial_rotary_matches_a_plain_rotation():
    from megatron.model.positional_embeddings import apply_rotary, rotary_tables
    x = torch.randn(2, 3, 5, 16, generator=torch.Generator().manual_seed(0))
    for r in (4, 8, 16):
        cos, sin = rotary_tables(5, r, 10000.0, x.device)
        assert torch.allclose(apply_rotary(x, cos, sin), _partial_rotary_reference(x, r), atol=1e-6), r


def test_sentencepiece_rotary_percent_launch_count_and_neox_logits(tmp_path, sentencepiece_model):
    import sentencepiece
    reference = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)
    prefix = preprocess(tmp_path, "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                        sentencepiece_model)
    check_ids(prefix, reference.encode, 3)  # eos id 3, as trained

    # 320 pieces padded to 384 (a multiple of 128); rotary: no position table; 4 of 16 channels rotate
    padded, h = 384, 64
    expected = padded * h + 2 * tiny_per_layer() + 2 * h
    assert expected == 124_672
    ckpt = tmp_path / "ckpt"
    flags = MODEL + TRAIN + ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                             sentencepiece_model, "--data-path", prefix, "--use-rotary-position-embeddings",
                             "--no-position-embedding", "--rotary-percent", 0.25, "--save", ckpt,
                             "--save-interval", ITERS]
    tool = subprocess.Popen([sys.executable, "tools/param_count.py", *map(str, flags)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    proc, ranks = launch(1, flags, str(tmp_path / "run"))
    assert ranks[0]["parameters"] == expected
    assert "architecture: rotary on 4 of 16 channels, gelu ffn 256, layernorm, 4 heads, tied\n" in proc.stdout
    curve = losses(proc.stdout)
    assert sorted(curve) == list(range(1, ITERS + 1)) and curve[ITERS] < curve[1], curve
    out = tool.communicate(timeout=120)[0]
    assert tool.returncode == 0
    assert f"parameters: {expected:,}\n" in out and f"vocab {SENTENCEPIECE_SIZE}," in out
    assert "architecture: rotary on 4 of 16 channels" in out

    # GPT-NeoX with partial_rotary_factor 0.25 computes the same logits from the exported weights
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM
    export = convert("--load", ckpt, "--output", tmp_path / "hf")
    assert export.returncode == 0, export.stderr
    assert "to GPTNeoXForCausalLM" in export.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.25 and model.num_parameters() == expected
    assert os.path.isfile(tmp_path / "hf" / "tokenizer.model") and model.config.eos_token_id == 3
    tokens = torch.randint(0, SENTENCEPIECE_SIZE, (2, 32), generator=torch.Generator().manual_seed(0))
    [ours] = run_distributed(1, our_logits, str(ckpt), tokens)
    with torch.no_grad():
        theirs = model(tokens).logits
    assert theirs.shape == ours.shape == (2, 32, padded)
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-5), (theirs - ours).abs().max()


def test_bloom_176b_published_flags_with_a_250680_token_tokenizer(tmp_path):
    """BigScience's tr11-176B flags with a tokenizer.json of 250,680 entries (BLOOM's size) padded
    to 250,880. By hand, h = 14336, 70 layers, ALiBi (no position table):
      word embedding  250,880 h          =   3,596,615,680
      embed LayerNorm 2 h                =          28,672
      70 layers x (12 h^2 + 13 h)        = 172,650,598,400
      final LayerNorm 2 h                =          28,672
      total                                176,247,271,424 (BLOOM's published count)
    At TP=1 the default padding (a multiple of 128) would give 250,752 rows instead."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(250_680)}
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0")).save(str(tmp_path / "tokenizer.json"))
    h = 14336
    parts = [250_880 * h, 2 * h, 70 * (12 * h * h + 13 * h), 2 * h]
    assert parts == [3_596_615_680, 28_672, 172_650_598_400, 28_672]
    total = sum(parts)
    assert total == 176_247_271_424
    proc = param_count_tool("--num-layers", 70, "--hidden-size", h, "--num-attention-heads", 112, "--seq-length", 2048,
                            "--position-embedding-type", "alibi", "--embed-layernorm", "--pad-vocab-size-to", 250880,
                            "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"parameters: {total:,}\n" in proc.stdout
    assert "estimated model parameters: 176.247271424\n" in proc.stdout
    assert "padded vocab size: 250,880 (vocab 250,680, --pad-vocab-size-to 250,880)" in proc.stdout


def test_hf_tokenizer_types_sizes_and_param_count_without_torch(hf_tokenizer_dir, sentencepiece_model):
    """PretrainedFromHF's size is len(tokenizer); HFTokenizer's (Microsoft) the base vocab, though
    it adds the pad / bos / unk tokens the tokenizer lacks; the tool reads both without torch."""
    from argparse import Namespace

    from megatron.tokenizer import build_tokenizer
    big = build_tokenizer(Namespace(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=hf_tokenizer_dir))
    ms = build_tokenizer(Namespace(tokenizer_type="HFTokenizer", tokenizer_model=hf_tokenizer_dir))
    assert big.vocab_size == ms.vocab_size == HF_TOKENIZER_SIZE and big.eod == ms.eod == 0
    assert len(ms.tokenizer) == HF_TOKENIZER_SIZE + 3 and ms.tokenizer.pad_token == "[PAD]"
    code = ("import sys, runpy; sys.argv = ['param_count.py'] + sys.argv[1:]; "
            "runpy.run_path('tools/param_count.py', run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    for flags in (["--tokenizer-type", "HFTokenizer", "--tokenizer-model", hf_tokenizer_dir],
                  ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", sentencepiece_model]):
        proc = subprocess.run([sys.executable, "-c", code, "--num-layers", "2", "--hidden-size", "64",
                               "--num-attention-heads", "4", "--seq-length", "32", *flags], cwd=ROOT,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
        assert proc.returncode == 0, proc.stderr
        size = HF_TOKENIZER_SIZE if "HFTokenizer" in flags else SENTENCEPIECE_SIZE
        assert f"padded vocab size: 384 (vocab {size}," in proc.stdout


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", "bigscience/bloom"],
     "--tokenizer-name-or-path bigscience/bloom: not a local file or directory; nothing is downloaded here"),
    (["--tokenizer-type", "GPTSentencePieceTokenizer"],
     "--tokenizer-type GPTSentencePieceTokenizer needs --tokenizer-model"),
    (["--tokenizer-model", "x.model"], "--tokenizer-model needs --tokenizer-type"),
])
def test_bad_tokenizer_flags_are_one_line_in_trainer_tool_and_preprocess(flags, message, tmp_path, capsys):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.runtime.refusal import ConfigError
    base = [str(f) for f in MODEL + TRAIN] + ["--data-path", str(tmp_path / "x")]
    with pytest.raises(ConfigError) as e:
        validate_args(parse_args(args_list=base + flags), world_size=1, cuda_available=False)
    assert message in str(e.value) and "\n" not in str(e.value)
    tool = param_count_tool(*MODEL, *flags)
    if "--tokenizer-type" in flags:  # the tool has no rule of its own for a type-less --tokenizer-model
        assert tool.returncode == 2 and message in tool.stderr and "Traceback" not in tool.stderr
    if flags[0] == "--tokenizer-type":  # preprocess_data's own parser, before any worker starts
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            load_tool("preprocess_data").get_args(["--input", "data/corpus.jsonl", "--output-prefix",
                                                   str(tmp_path / "c"), *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--pad-vocab-size-to", 256], "--pad-vocab-size-to 256 is below the tokenizer's 300 tokens"),
    (["--pad-vocab-size-to", 330, "--make-vocab-size-divisible-by", 1, "--tensor-model-parallel-size", 4],
     "--pad-vocab-size-to 330 is not divisible by --tensor-model-parallel-size 4"),
    (["--pad-vocab-size-to", 320], "--pad-vocab-size-to 320 is not divisible by --make-vocab-size-divisible-by 128"),
    (["--use-rotary-position-embeddings", "--rotary-percent", 0.1],
     "--rotary-percent 0.1 of head dim 16 gives 1 rotary channels"),
])
def test_bad_pad_and_rotary_flags_are_one_line(extra, message, hf_tokenizer_dir):
    proc = param_count_tool(*MODEL, "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path",
                            hf_tokenizer_dir, *extra)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_gpt2_path_needs_none_of_the_optional_libraries_and_a_missing_one_is_one_line(tmp_path):
    """With transformers, tokenizers and sentencepiece made unimportable, the GPT-2 BPE tokenizer
    still builds, and asking for a SentencePiece model names the package to install."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('transformers', 'tokenizers', 'sentencepiece'):
            raise ImportError(name)
sys.meta_path.insert(0, Block())
from argparse import Namespace
from megatron.tokenizer import build_tokenizer
tok = build_tokenizer(Namespace(tokenizer_type=None, vocab_file='data/gpt2-vocab.json',
                                merge_file='data/gpt2-merges.txt'))
print(tok.tokenize('def main():'), tok.eod)
try:
    build_tokenizer(Namespace(tokenizer_type='GPTSentencePieceTokenizer', tokenizer_model='README.md'))
except ValueError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    from megatron.tokenizer.gpt2_tokenization import GPT2Tokenizer
    reference = GPT2Tokenizer(os.path.join(ROOT, "data/gpt2-vocab.json"), os.path.join(ROOT, "data/gpt2-merges.txt"))
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{reference.encode('def main():')} {reference.encoder['<|endoftext|>']}"
    assert lines[1] == "this tokenizer needs the 'sentencepiece' package: pip install sentencepiece " \
                       "(or pip install -e .[sentencepiece])"


def test_resume_keeps_the_saved_padded_vocab_unless_pad_vocab_size_to_says_otherwise():
    from argparse import Namespace

    from megatron.checkpoint.resume import _keep_padded_vocab
    from megatron.model.shape import ModelShape
    from megatron.runtime.refusal import ConfigError
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=300,
                       make_vocab_size_divisible_by=64, pad_vocab_size_to=320, tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match="padded to 384, this run's --pad-vocab-size-to is 320; pass "
                                          "--pad-vocab-size-to 384"):
        _keep_padded_vocab(384, shape, "--load x")
    args = Namespace(model_shape=shape)
    _keep_padded_vocab(320, args.model_shape, "--load x")  # the same size: nothing to change
    assert args.model_shape.padded_vocab_size == 320


def test_trainer_refuses_a_pad_below_the_tokenizer_in_one_line(entry_point, hf_tokenizer_dir):
    """Checked once the tokenizer is built, before the model is."""
    code, err, builds = entry_point(trainer_flags({"--vocab-size": "drop", "--tokenizer-type": "PretrainedFromHF",
                                           "--tokenizer-name-or-path": hf_tokenizer_dir,
                                           "--pad-vocab-size-to": 256, "--make-vocab-size-divisible-by": 64}))
    assert code == 2 and not builds
    assert err[-1].startswith("pretrain_gpt.py: error: --pad-vocab-size-to 256 is below the tokenizer's 300 tokens")


def test_hftokenizer_added_eos_must_fit_the_padded_vocab(entry_point, hf_tokenizer_dir, tmp_path):
    """Microsoft's HFTokenizer adds an eos the tokenizer lacks past its vocab size (300 here): the
    padding must hold it, or the run stops in one line before the model is built."""
    transformers = pytest.importorskip("transformers")
    no_eos = tmp_path / "no_eos"
    transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(hf_tokenizer_dir, "tokenizer.json")
                                         ).save_pretrained(no_eos)
    base = {"--vocab-size": "drop", "--tokenizer-type": "HFTokenizer", "--tokenizer-model": no_eos}
    code, err, builds = entry_point(trainer_flags({**base, "--pad-vocab-size-to": 300,
                                                   "--make-vocab-size-divisible-by": 4}))
    assert code == 2 and not builds
    assert err[-1].startswith("pretrain_gpt.py: error: the tokenizer's end-of-document id 301 is outside the "
                              "padded vocab 300")


def test_param_count_size_equals_len_of_the_transformers_tokenizer(hf_tokenizer_dir, tmp_path):
    """The torch-free count of tools/param_count.py against transformers' own len(tokenizer), also
    when tokenizer_config.json names special tokens that tokenizer.json lacks (added on load)."""
    transformers = pytest.importorskip("transformers")
    from argparse import Namespace

    from megatron.tokenizer.external import vocab_size_without_torch
    edited = tmp_path / "edited"
    edited.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(hf_tokenizer_dir, name), encoding="utf-8") as f:
            content = json.load(f)
        if name == "tokenizer_config.json":
            content.update(pad_token="<pad>", extra_special_tokens=["<x1>", "<x2>"])
        (edited / name).write_text(json.dumps(content))
    for path in (hf_tokenizer_dir, edited):
        counted = vocab_size_without_torch(Namespace(tokenizer_name_or_path=str(path)), "PretrainedFromHF")
        assert counted == len(transformers.AutoTokenizer.from_pretrained(path)), path
    assert counted == HF_TOKENIZER_SIZE + 3
