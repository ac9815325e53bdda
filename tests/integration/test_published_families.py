"""One published launch script per family, shrunk to tiny sizes but keeping every flag it passes,
trained to completion in-process (pretrain_gpt.main on two gloo ranks) with the exact parameter
count worked out by hand below.

`shrink` replaces only sizes, lengths, intervals, parallel sizes that fit two ranks, data and
tokenizer paths and output directories; each family's test asserts the shrunk list has exactly the
published flag names, less the ones `DROPPED` names with the reason. Families:

* BLOOM-176B (BigScience): HF tokenizer, --pad-vocab-size-to, ALiBi, embedding LayerNorm, bf16,
  ramp-up, weighted split paths (two training ranges, two validation groups), PP=2 with
  --pp-partition-method type:transformer|embedding; the kill switch's file is absent, so the run
  goes to the end (the switch firing: tests/integration/test_schedule_and_data_groups.py), and
  --sync-tp-duplicated-parameters runs at TP=1, where there is nothing to sync;
* LLaMA-2 (Microsoft): SentencePiece, rotary, SwiGLU, RMSNorm, GQA, untied output, no biases, bf16, TP=2;
* MoE-64 125M (Microsoft): 2 experts on EP=2 (DP=2), the token-based schedule and length;
* 1.3B rope (Microsoft): --rotary-percent 0.25, ZeRO-1, TP=2, token schedule;
* 1.3B megatron checkpointing (Microsoft, no --deepspeed): --recompute-granularity/method/num-layers, TP=2;
* Ulysses 1.3B 32k (Microsoft): DeepSpeed-Ulysses at --ds-sequence-parallel-size 2 (the script's 4
  on its 4 ranks shrunk to 2) with ZeRO-1 (partitioned over the two SP ranks), token schedule.

No published script passes --activations-checkpoint-method; its spellings are run in
tests/integration/test_activation_checkpointing.py.
"""
import contextlib
import io
import os

import pytest

from tests.conftest import HF_TOKENIZER_SIZE, SENTENCEPIECE_SIZE
from tests.support.distributed import run_distributed
from tests.support.published_scripts import HERE, load
from tests.support.shrink_scripts import (
    DROPPED,
    GPT2,
    GPT2_PADDED,
    SHRINKABLE,
    drop,
    ds_config,
    flag_names,
    flags_and_values,
    outputs,
    shrink,
)


def gpt_layer(h):
    return (3 * h * h + 3 * h) + (h * h + h) + (8 * h * h + 5 * h) + 4 * h


def bloom(tmp, data):
    argv = load(os.path.join(HERE, "data", "published_scripts", "bigscience_tr11_bloom_176B.txt"))
    hf_dir, prefix = data["hf"]
    train, valid = tmp / "train-splits.txt", tmp / "valid-splits.txt"
    # BigScience's split files: one group blending two document ranges, two validation groups
    train.write_text(f'"TRAIN: 0.6 0:0.45 {prefix}, 0.4 0.45:0.9 {prefix}"\n')
    valid.write_text(f'"VALID_A: 1 0.9:0.95 {prefix}" "VALID_B: 1 0.95:1 {prefix}"\n')
    sizes = {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 2, "--num-layers": 2,
             "--hidden-size": 32, "--num-attention-heads": 4, "--seq-length": 32, "--max-position-embeddings": 32,
             "--micro-batch-size": 1, "--rampup-batch-size": (2, 2, 4), "--global-batch-size": 4,
             "--train-samples": 16, "--tokenizer-name-or-path": hf_dir,
             "--kill-switch-path": tmp / "bloom" / "kill-switch",  # absent: the run goes to the end
             "--pad-vocab-size-to": 384,  # >= the 300 entries, a multiple of the default 128
             "--lr-decay-samples": 12, "--lr-warmup-samples": 2,
             "--save-interval": 1000, "--eval-interval": 4, **outputs(tmp, "bloom", argv),
             "--train-weighted-split-paths-path": train, "--valid-weighted-split-paths-path": valid,
             "--distributed-backend": "gloo", "--deepspeed_config": ds_config(tmp, "bloom", "bf16")}
    # ALiBi: no position table; embedding LayerNorm 2h; tied output layer; final LayerNorm 2h
    h = 32
    assert 384 >= HF_TOKENIZER_SIZE
    expected = 384 * h + 2 * h + 2 * gpt_layer(h) + 2 * h
    return argv, shrink(argv, sizes), expected, 5  # 2 iterations of 2 samples (ramp-up), 3 of 4


def llama(tmp, data):
    argv = load(os.path.join(HERE, "data", "published_scripts", "microsoft_llama2.txt"))
    sp_model, prefix = data["sp"]
    sizes = {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 1, "--num-layers": 2,
             "--hidden-size": 32, "--ffn-hidden-size": 64, "--num-attention-heads": 4, "--micro-batch-size": 1,
             "--global-batch-size": 4, "--seq-length": 32, "--max-position-embeddings": 32, "--train-iters": 3,
             **outputs(tmp, "llama", argv), "--data-path": (1, prefix), "--tokenizer-model": sp_model,
             "--distributed-backend": "gloo", "--lr-warmup-iters": 1, "--save-interval": 1000,
             "--eval-interval": 2, "--eval-iters": 1, "--num-key-value-heads": 2,
             "--deepspeed_config": ds_config(tmp, "llama", "bf16")}
    h, f, heads, kv_heads = 32, 64, 4, 2
    head_dim = h // heads
    # 320 SentencePiece pieces padded to a multiple of 128 x TP 2 = 512
    padded = -(-SENTENCEPIECE_SIZE // 256) * 256
    assert padded == 512
    attention = h * h + 2 * kv_heads * head_dim * h + h * h  # Q, K and V of 2 KV heads, dense; no biases
    mlp = 2 * f * h + f * h  # SwiGLU: gate and up h->f, down f->h
    layer = attention + mlp + 2 * h  # two RMSNorms (weight only)
    expected = padded * h + padded * h + 2 * layer + h  # input table, untied output layer, final RMSNorm
    return argv, shrink(argv, sizes), expected, 3


TOKEN_SCHEDULE = {"--lr-decay-tokens": 384, "--lr-warmup-tokens": 128, "--train-tokens": 384}


def moe(tmp, data):
    argv = drop(load(os.path.join(HERE, "data", "published_scripts", "microsoft_moe_125M_MoE64.txt")), "--fp16")
    sizes = {"--moe-expert-parallel-size": 2, "--num-experts": 2, **TOKEN_SCHEDULE, "--micro-batch-size": 1,
             "--global-batch-size": 4, "--num-layers": 2, "--hidden-size": 32, "--num-attention-heads": 4,
             "--seq-length": 32, "--max-position-embeddings": 32,
             "--train-iters": 1000,  # as in the script, far more than --train-tokens allows
             "--eval-interval": 2, "--eval-iters": 1, "--log-interval": 1, "--save-interval": 1000,
             **outputs(tmp, "moe", argv), **GPT2, "--data-path": data["gpt2"],
             # Microsoft's MoE template carries a disabled legacy curriculum block (dropped, one note)
             "--deepspeed_config": ds_config(tmp, "moe", extra={"curriculum_learning": {
                 "enabled": False, "curriculum_type": "seqlen", "min_difficulty": 80, "max_difficulty": 2048,
                 "schedule_type": "fixed_linear",
                 "schedule_config": {"total_curriculum_step": 1000, "difficulty_step": 8}}})}
    h, experts = 32, 2
    # --expert-interval 2 (the forks' default): layer 2 is the MoE layer. Each expert is the dense
    # MLP (8h^2+5h); DeepSpeed's top-1 gate is a bias-free h x E matrix.
    dense = gpt_layer(h)
    moe_layer = (3 * h * h + 3 * h) + (h * h + h) + 4 * h + experts * (8 * h * h + 5 * h) + h * experts
    expected = GPT2_PADDED * h + 32 * h + dense + moe_layer + 2 * h
    # 4 samples x 32 tokens = 128 tokens an iteration: 384 tokens end the run after 3
    return argv, shrink(argv, sizes), expected, 3


def microsoft_rebase(tmp, data, script, name, tp, extra):
    argv = drop(load(os.path.join(HERE, "data", "published_scripts", script)), "--fp16")
    sizes = {"--tensor-model-parallel-size": tp, **TOKEN_SCHEDULE, "--micro-batch-size": 1,
             "--global-batch-size": 4 if tp == 2 else 2, "--num-layers": 2, "--hidden-size": 32,
             "--num-attention-heads": 4, "--train-samples": 1000, "--eval-interval": 2, "--eval-iters": 1,
             "--log-interval": 1, "--save-interval": 1000, **outputs(tmp, name, argv), **GPT2,
             "--data-path": data["gpt2"], **extra}
    return argv, shrink(argv, sizes)


def rope(tmp, data):
    argv, small = microsoft_rebase(tmp, data, "microsoft_rebase_1.3B_rope.txt", "rope", 2, {
        "--pipeline-model-parallel-size": 1, "--seq-length": 32, "--max-position-embeddings": 32,
        "--deepspeed_config": ds_config(tmp, "rope", zero_stage=1)})
    # rotary on int(8 x 0.25) = 2 channels of each head: no parameters, no position table; tied output
    h = 32
    return argv, small, GPT2_PADDED * h + 2 * gpt_layer(h) + 2 * h, 3


def recompute(tmp, data):
    argv, small = microsoft_rebase(tmp, data, "microsoft_rebase_1.3B_megatron_checkpointing.txt", "recompute", 2, {
        "--seq-length": 32, "--max-position-embeddings": 32})
    h = 32
    return argv, small, GPT2_PADDED * h + 32 * h + 2 * gpt_layer(h) + 2 * h, 3


def ulysses(tmp, data):
    argv, small = microsoft_rebase(tmp, data, "microsoft_ulysses_1.3B_32k.txt", "ulysses", 1, {
        "--ds-sequence-parallel-size": 2, "--seq-length": 64, "--max-position-embeddings": 64,
        "--deepspeed_config": ds_config(tmp, "ulysses", zero_stage=1)})
    h = 32
    # 2 samples x 64 tokens = 128 tokens an iteration: 3 iterations
    return argv, small, GPT2_PADDED * h + 64 * h + 2 * gpt_layer(h) + 2 * h, 3


FAMILIES = {"bloom": bloom, "llama": llama, "moe": moe, "rope": rope, "recompute": recompute, "ulysses": ulysses}


def _train_all(runs):
    import pretrain_gpt
    results = {}
    for name, argv in runs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            _, progress = pretrain_gpt.main(argv)
        results[name] = {"stdout": out.getvalue(), "iteration": progress.iteration,
                         "samples": progress.consumed_train_samples, "tokens": progress.consumed_train_tokens}
    return results


@pytest.fixture(scope="module")
def families(tmp_path_factory, corpus, hf_tokenizer_dir, sentencepiece_model):
    from tests.support.tool_modules import preprocess
    tmp = tmp_path_factory.mktemp("families")
    (tmp / "hf").mkdir()
    (tmp / "sp").mkdir()
    data = {"gpt2": corpus,
            "hf": (hf_tokenizer_dir, preprocess(tmp / "hf", "--tokenizer-type", "PretrainedFromHF",
                                                "--tokenizer-name-or-path", hf_tokenizer_dir)),
            "sp": (sentencepiece_model, preprocess(tmp / "sp", "--tokenizer-type", "GPTSentencePieceTokenizer",
                                                   "--tokenizer-model", sentencepiece_model))}
    built = {name: make(tmp, data) for name, make in FAMILIES.items()}
    # every family one after the other on the same two gloo processes (each main sets up its own groups)
    ranks = run_distributed(2, _train_all, [(name, [str(a) for a in b[1]]) for name, b in built.items()],
                            timeout=600)
    # rank 0 prints the report; the last pipeline stage (rank 1 at PP=2) logs the losses
    return {name: (built[name], {**ranks[0][name], "stdout": ranks[0][name]["stdout"] + ranks[1][name]["stdout"]},
                   tmp) for name in FAMILIES}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_runs_to_completion_with_the_exact_count(families, name):
    from tests.support.launch import logged_iterations
    (published, small, expected, iterations), result, tmp = families[name]
    # the same flag names in the same order, less the dropped ones
    full = load(os.path.join(HERE, "data", "published_scripts", {
        "bloom": "bigscience_tr11_bloom_176B.txt", "llama": "microsoft_llama2.txt",
        "moe": "microsoft_moe_125M_MoE64.txt", "rope": "microsoft_rebase_1.3B_rope.txt",
        "recompute": "microsoft_rebase_1.3B_megatron_checkpointing.txt",
        "ulysses": "microsoft_ulysses_1.3B_32k.txt"}[name]))
    assert flag_names(small) == [f for f in flag_names(full) if f not in DROPPED] == flag_names(published)
    # and every value shrink changed belongs to a size, length, interval, parallel size or path
    changed = {f for (f, old), (_, new) in zip(flags_and_values(published), flags_and_values(small), strict=True)
               if old != new}
    assert changed <= SHRINKABLE, changed - SHRINKABLE
    out = result["stdout"]
    assert f"model parameters (exact): {expected:,} total" in out, out[-3000:]
    assert result["iteration"] == iterations
    logged = logged_iterations(out)
    assert max(logged) == iterations
    assert os.path.isdir(tmp / name / "ckpt")


def test_family_specifics(families):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.launch import logged_iterations
    (_, _, _, _), bloom, tmp = families["bloom"]
    # ramp-up 2 2 4: batch 2 for the first 4 samples (2 iterations), then 4 until 16 samples
    logged = logged_iterations(bloom["stdout"])
    assert [logged[it]["global batch size"] for it in range(1, 6)] == [2, 2, 4, 4, 4]
    assert bloom["samples"] == 16
    # each validation group evaluated at iteration 4 (--eval-interval) and logged under its own name,
    # in the log and in TensorBoard (BigScience's tags)
    for group in ("VALID_A", "VALID_B"):
        assert any(ln.startswith(f" {group} loss at iteration 4 |") for ln in bloom["stdout"].splitlines()), group
    events = EventAccumulator(str(tmp / "bloom" / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for group in ("VALID_A", "VALID_B"):
        assert 4 in [e.step for e in events.Scalars(f"lm-loss-validation/{group}/lm loss validation ppl")]
    # the token-based runs stop at --train-tokens (3 x 128 tokens), far before --train-iters/--train-samples
    for name in ("moe", "rope", "ulysses"):
        assert families[name][1]["tokens"] == 384, name
    # EP=2: one of the two experts on each rank, each the dense MLP 8h^2+5h at h=32
    assert "experts per EP rank (EP=2): 1 experts, 8,352 expert parameters" in families["moe"][1]["stdout"]
    assert "curriculum_learning is disabled" in families["moe"][1]["stdout"]
    assert "FLOPs per sample (model, fwd+bwd, recompute): " in families["recompute"][1]["stdout"]
    ulysses_out = families["ulysses"][1]["stdout"]
    assert "--ds-sequence-parallel-size" not in "".join(ln for ln in ulysses_out.splitlines()
                                                        if ln.startswith("accepted, no effect: "))
    assert "DP=1 x SP=2" in ulysses_out  # the memory table: one replica of two SP ranks
