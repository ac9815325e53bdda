"""The vocabulary size of a Hugging Face tokenizer (megatron/tokenizer/external.py) with every form
of special tokens transformers accepts: named in tokenizer_config.json as strings or as AddedToken
entries, in additional_special_tokens / extra_special_tokens (a list or a dict), in its
added_tokens_decoder, in the legacy special_tokens_map.json and added_tokens.json, or saved in
tokenizer.json; tokens the vocab already holds, and tokens named twice, counted once. The expected
sizes are counted by hand; transformers' len(tokenizer) agrees, and so must the trainer
(PretrainedFromHF: len(tokenizer); Microsoft's HFTokenizer: the base vocab) and the torch-free count
of tools/param_count.py."""
import json
import os
import shutil
from argparse import Namespace

import pytest

from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.external import vocab_size_without_torch
from tests.conftest import HF_TOKENIZER_SIZE

transformers = pytest.importorskip("transformers")


def added_token(content):
    """An AddedToken as transformers serialises one into tokenizer_config.json."""
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True, "__type": "AddedToken"}


def decoder_entry(content):
    """An added_tokens_decoder entry as transformers writes it."""
    entry = added_token(content)
    del entry["__type"]
    return entry


# name: (tokenizer_config.json changes, other files {name: content}, tokens added by hand)
CASES = {
    "no special tokens beyond eos": ({}, {}, 0),
    "every named token as a string": ({"bos_token": "<s>", "unk_token": "<unk>", "sep_token": "<sep>",
                                       "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"}, {}, 6),
    "named tokens as AddedToken entries": ({"bos_token": added_token("<s>"), "mask_token": added_token("<mask>")},
                                           {}, 2),
    "additional_special_tokens list": ({"additional_special_tokens": ["<a1>", "<a2>", "<a3>"]}, {}, 3),
    "additional_special_tokens of AddedTokens": ({"additional_special_tokens": [added_token("<a1>")]}, {}, 1),
    "extra_special_tokens list": ({"extra_special_tokens": ["<x1>", "<x2>"]}, {}, 2),
    "extra_special_tokens dict": ({"extra_special_tokens": {"image_token": "<image>", "audio_token": "<audio>"}},
                                  {}, 2),
    "extra_special_tokens dict of AddedTokens": ({"extra_special_tokens": {"image_token": added_token("<image>")}},
                                                 {}, 1),
    # the values are what counts, not the names: "a" and <|endoftext|> are in the vocab already, and
    # of the mixed dict only <audio> is new (counting the keys would add 2 in each case)
    "extra_special_tokens dict of tokens the vocab holds": ({"extra_special_tokens": {
        "image_token": "a", "eos_alias": "<|endoftext|>"}}, {}, 0),
    "extra_special_tokens dict, one token new": ({"extra_special_tokens": {
        "image_token": "a", "audio_token": "<audio>"}}, {}, 1),
    # "a" is a byte of the base vocab, <|endoftext|> its one special token: nothing new
    "tokens the vocab holds": ({"pad_token": "a", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, {}, 0),
    # <pad> named as pad and as an extra token, <x> as extra and as unk: 2 tokens
    "a token named twice": ({"pad_token": "<pad>", "extra_special_tokens": ["<pad>", "<x>"], "unk_token": "<x>"},
                            {}, 2),
    "added_tokens_decoder": ({"added_tokens_decoder": {"0": decoder_entry("<|endoftext|>"),
                                                       "300": decoder_entry("<d1>"), "301": decoder_entry("<d2>")}},
                             {}, 2),
    "legacy special_tokens_map.json": ({}, {"special_tokens_map.json": {
        "pad_token": "<pad>", "bos_token": added_token("<s>"), "additional_special_tokens": ["<m1>"]}}, 3),
    # its pad replaces the config's: <p2> only
    "special_tokens_map.json over the config": ({"pad_token": "<pad>"},
                                                {"special_tokens_map.json": {"pad_token": "<p2>"}}, 1),
    # its extra tokens add to the config's: <x1>, <x2>
    "special_tokens_map.json extra tokens": ({"extra_special_tokens": ["<x1>"]},
                                             {"special_tokens_map.json": {"extra_special_tokens": ["<x2>", "<x1>"]}},
                                             2),
    # with an added_tokens_decoder in the config, transformers does not read the legacy files
    "legacy files beside an added_tokens_decoder": ({"added_tokens_decoder": {"0": decoder_entry("<|endoftext|>")}},
                                                    {"special_tokens_map.json": {"pad_token": "<p2>"},
                                                     "added_tokens.json": {"<t1>": 300}}, 0),
    "legacy added_tokens.json": ({}, {"added_tokens.json": {"<t1>": 300, "<t2>": 301}}, 2),
}


def _directory(base, tmp_path, config_changes, files):
    out = tmp_path / "tokenizer"
    shutil.copytree(base, out)
    with open(out / "tokenizer_config.json", encoding="utf-8") as f:
        config = json.load(f)
    config.update(config_changes)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (out / name).write_text(json.dumps(content))
    return str(out)


def _sizes(path):
    """(trainer PretrainedFromHF, trainer HFTokenizer, param_count PretrainedFromHF, param_count HFTokenizer)."""
    big = Namespace(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=path)
    ms = Namespace(tokenizer_type="HFTokenizer", tokenizer_model=path)
    return (build_tokenizer(big).vocab_size, build_tokenizer(ms).vocab_size,
            vocab_size_without_torch(big, "PretrainedFromHF"), vocab_size_without_torch(ms, "HFTokenizer"))


@pytest.mark.parametrize("name", CASES)
def test_vocab_size_with_each_form_of_special_tokens(name, hf_tokenizer_dir, tmp_path):
    config_changes, files, added = CASES[name]
    path = _directory(hf_tokenizer_dir, tmp_path, config_changes, files)
    expected = HF_TOKENIZER_SIZE + added
    assert len(transformers.AutoTokenizer.from_pretrained(path)) == expected  # transformers accepts the form
    assert _sizes(path) == (expected, HF_TOKENIZER_SIZE, expected, HF_TOKENIZER_SIZE)


def test_tokens_saved_in_tokenizer_json(hf_tokenizer_dir, tmp_path):
    """add_tokens / add_special_tokens, then save_pretrained: the tokens land in tokenizer.json."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir)
    tokenizer.add_tokens(["foo", "<bar>"])
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    tokenizer.save_pretrained(tmp_path / "saved")
    path = str(tmp_path / "saved")
    assert sorted(os.listdir(path)) == ["tokenizer.json", "tokenizer_config.json"]
    assert _sizes(path) == (HF_TOKENIZER_SIZE + 3, HF_TOKENIZER_SIZE, HF_TOKENIZER_SIZE + 3, HF_TOKENIZER_SIZE)
