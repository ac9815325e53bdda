"""Every published script of tests/data/published_scripts/flag_table/ (the scripts that use issue 39's
flags), run shrunk: every flag the script passes is kept, only sizes, lengths, intervals, parallel sizes
(1-2 ranks), data, tokenizer and output paths change (checked below, as in test_published_families.py).

* Argonne's LLaMA-2 script with its W&B flags trains on two gloo ranks (TP=2, its PP=2 shrunk to 1) to
  the end with the exact parameter count worked out by hand, and its offline W&B run holds the script's
  project and run name;
* every other script ends in its one line through pretrain_gpt.py (exit 2, nothing built, torch.distributed
  not started): the same line tests/unit/test_flag_table.py gets at the script's own scale.
"""
import contextlib
import io
import os

import pytest

from tests.conftest import SENTENCEPIECE_SIZE
from tests.support.distributed import run_distributed
from tests.support.flag_table_scripts import PUBLISHED
from tests.support.published_scripts import HERE, load
from tests.support.shrink_scripts import (
    GPT2,
    SHRINKABLE,
    ds_config,
    flag_names,
    flags_and_values,
    outputs,
    shrink,
)

FOLDER = os.path.join(HERE, "data", "published_scripts", "flag_table")
# the W&B directory and the Megatron-LM scripts' data cache are output paths too
SHRINKABLE_HERE = SHRINKABLE | {"--wandb-save-dir", "--data-cache-path"}

# sizes for the refused scripts, for the flags each passes (the line comes before anything is built)
TINY = {"--num-layers": 2, "--hidden-size": 32, "--ffn-hidden-size": 64, "--num-attention-heads": 4,
        "--seq-length": 32, "--max-position-embeddings": 32, "--micro-batch-size": 1, "--global-batch-size": 2,
        "--train-iters": 3, "--train-samples": 6, "--tensor-model-parallel-size": 1,
        "--pipeline-model-parallel-size": 1, "--eval-iters": 1, "--eval-interval": 2, "--save-interval": 1000,
        "--rampup-batch-size": (1, 1, 4), "--lr-decay-samples": 6, "--lr-warmup-samples": 1}
# the refused scripts' layouts on two ranks where the script's feature needs pipeline stages
TWO_STAGES = {"deepspeedai_gpt3_functional_test_vp2", "megatron_lm_gpt3_175b", "megatron_lm_mixtral_8x7b"}


def _published(name):
    return load(os.path.join(FOLDER, name + ".txt"))


def refused_tiny(name, tmp, corpus, hf_dir, sp_model):
    argv = _published(name)
    sizes = {flag: value for flag, value in TINY.items() if flag in argv}
    if name in TWO_STAGES:
        sizes["--pipeline-model-parallel-size"] = 2
        sizes["--global-batch-size"] = 2
    paths = {"--data-path": corpus, **GPT2, "--save": tmp / name / "ckpt", "--load": tmp / name / "ckpt",
             "--tensorboard-dir": tmp / name / "tb",
             "--tokenizer-model": hf_dir if "HuggingFaceTokenizer" in argv else sp_model}
    # MOCK data (Megatron-LM's examples) stays MOCK; a weighted list keeps its weight
    if "--data-path" in argv and argv[argv.index("--data-path") + 1] == "1":
        paths["--data-path"] = (1, corpus)
    sizes.update({flag: value for flag, value in paths.items() if flag in argv})
    return argv, shrink(argv, sizes), 2 if name in TWO_STAGES else 1


def argonne(tmp, sp_model, sp_prefix):
    argv = _published("argonne_llama2_wandb")
    sizes = {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 1, "--num-layers": 2,
             "--hidden-size": 32, "--ffn-hidden-size": 64, "--num-attention-heads": 4, "--num-key-value-heads": 2,
             "--micro-batch-size": 1, "--global-batch-size": 4, "--seq-length": 32, "--max-position-embeddings": 32,
             "--train-iters": 3, "--lr-warmup-iters": 1, "--save-interval": 1000, "--eval-interval": 2,
             "--eval-iters": 1, **outputs(tmp, "argonne", argv), "--data-path": (1, sp_prefix),
             "--tokenizer-model": sp_model, "--distributed-backend": "gloo", "--wandb-save-dir": tmp / "wandb",
             "--deepspeed_config": ds_config(tmp, "argonne", "bf16")}
    # by hand: LLaMA at h 32, ffn 64, 4 heads of 8, 2 KV heads; no biases; 320 pieces padded to 128 x TP 2
    h, f, kv_dim = 32, 64, 2 * 8
    padded = 512
    assert padded >= SENTENCEPIECE_SIZE and padded % 256 == 0 and padded - 256 < SENTENCEPIECE_SIZE
    layer = (h * h + 2 * kv_dim * h + h * h) + 3 * f * h + 2 * h  # Q, K, V, dense; SwiGLU; two RMSNorms
    expected = 2 * padded * h + 2 * layer + h  # untied input and output tables, final RMSNorm
    return argv, shrink(argv, sizes), expected


def _train(argv):
    import pretrain_gpt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _, progress = pretrain_gpt.main(argv)
    return {"stdout": out.getvalue(), "iteration": progress.iteration}


@pytest.fixture(scope="module")
def argonne_run(tmp_path_factory, sentencepiece_model):
    from tests.support.tool_modules import preprocess
    tmp = tmp_path_factory.mktemp("argonne")
    prefix = preprocess(tmp, "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                        sentencepiece_model)
    published, small, expected = argonne(tmp, sentencepiece_model, prefix)
    with pytest.MonkeyPatch.context() as env:  # W&B writes its run locally, no network
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        ranks = run_distributed(2, _train, [str(a) for a in small], timeout=600)
    return published, small, expected, ranks, tmp


def _only_sizes_changed(published, small):
    assert flag_names(small) == flag_names(published)  # every flag kept, --fp16 / --bf16 included
    changed = {f for (f, old), (_, new) in zip(flags_and_values(published), flags_and_values(small), strict=True)
               if old != new}
    assert changed <= SHRINKABLE_HERE, changed - SHRINKABLE_HERE


def test_argonne_wandb_script_trains_shrunk_with_the_exact_count(argonne_run):
    from tests.support.launch import logged_iterations
    from tests.support.wandb_offline import offline_run
    published, small, expected, ranks, tmp = argonne_run
    _only_sizes_changed(published, small)
    out = ranks[0]["stdout"] + ranks[1]["stdout"]
    assert f"model parameters (exact): {expected:,} total" in out, out[-3000:]
    assert ranks[0]["iteration"] == ranks[1]["iteration"] == 3
    assert max(logged_iterations(out)) == 3
    # the script's own W&B project and run name, in the offline run under its (shrunk) --wandb-save-dir
    name, project, history, _ = offline_run(str(tmp / "wandb"))
    assert (name, project) == ("exp0", "pretrain-llama2")
    assert {1, 2, 3} <= set(history) and max(history) == 3  # each iteration's scalars, to the end


REFUSED = sorted(set(PUBLISHED) - {"argonne_llama2_wandb"})


@pytest.mark.parametrize("name", REFUSED)
def test_refused_script_shrunk_ends_in_its_one_line(name, entry_point, tmp_path, corpus, hf_tokenizer_dir,
                                                    sentencepiece_model):
    published, small, world = refused_tiny(name, tmp_path, corpus, hf_tokenizer_dir, sentencepiece_model)
    _only_sizes_changed(published, small)
    code, lines, builds = entry_point([str(a) for a in small], world)
    assert (code, builds) == (2, [])
    assert lines == [f"pretrain_gpt.py: error: {PUBLISHED[name]}"]
