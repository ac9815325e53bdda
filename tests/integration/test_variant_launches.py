"""Real `deepspeed --num_gpus N pretrain_gpt.py` runs of the architecture variants, the fewest
that put every variant under TP=2 and under PP=2: a LLaMA-style (rotary, SwiGLU, RMSNorm, GQA,
untied, no bias but Qwen2's QKV bias, split over TP like the QKV rows) and a BLOOM-style model
(ALiBi with 6 heads, embedding LayerNorm, GeLU) at
TP=2 x PP=2, and MQA with a GLU of non-default ffn size and --kv-channels != h/a at PP=2 (MQA
needs TP=1). Each rank's cached count equals the analytic table, tools/param_count.py and the
numel of the TP=1 PP=1 model; the LLaMA-style run also resumes exactly from its checkpoint,
which a GPT-2 launch then refuses before building a model, resumes at TP=1 x PP=1 with the
uninterrupted run's loss, and exports to Qwen2ForCausalLM; the BLOOM-style one exports to
BloomForCausalLM, whose logits (its own ALiBi, embedding LayerNorm and GeLU) are compared with ours."""
import re
import subprocess
import sys

import pytest
import torch

from megatron.config.arguments import parse_args
from megatron.config.validation import validate_args
from megatron.model.analytic import analytic_parameter_counts
from tests.support.distributed import run_distributed
from tests.support.hf_export import convert, our_logits
from tests.support.launcher import TINY, launch, losses

ITERS = 6
VOCAB = 512  # a multiple of 128 x TP 2: every layout builds the same model
LLAMA = ["--use-rotary-position-embeddings", "--no-position-embedding", "--swiglu", "--normalization", "rmsnorm",
         "--num-key-value-heads", 2, "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--add-qkv-bias"]  # Megatron-LM's: Qwen2's bias on QKV only
# head dim 48 / 6 = 8: transformers' BLOOM has no other head dim
BLOOM = ["--position-embedding-type", "alibi", "--embed-layernorm", "--hidden-size", 48, "--num-attention-heads", 6]
MQA_GLU = ["--position-embedding-type", "rope", "--group-query-attention", "--glu-activation", "geglu",
           "--ffn-hidden-size", 100, "--kv-channels", 24]


def flags_for(variant, tp, pp, *extra):
    tiny = [str(VOCAB) if TINY[i - 1] == "--vocab-size" else a for i, a in enumerate(TINY)]
    return tiny + variant + ["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp,
                             "--global-batch-size", 4, "--train-iters", ITERS, *extra]


def shape_of(flags, world_size):
    import dataclasses
    args = validate_args(parse_args(args_list=[str(f) for f in flags]), world_size=world_size, cuda_available=False)
    return dataclasses.replace(args.model_shape, vocab_size=VOCAB)


def _tp1_pp1_numel(shape):
    import dataclasses

    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    shape = dataclasses.replace(shape, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    return sum(p.numel() for p in GPTModel(GPTConfig(shape)).parameters())


def check_counts(proc, ranks, flags, num_ranks):
    shape = shape_of(flags, num_ranks)
    expected = analytic_parameter_counts(shape)
    # the offline tool runs while the TP=1 PP=1 model is built
    offline = subprocess.Popen([sys.executable, "tools/param_count.py", *map(str, flags)], stdout=subprocess.PIPE,
                               text=True)
    [numel] = run_distributed(1, _tp1_pp1_numel, shape)
    tool = offline.communicate()[0]
    assert offline.returncode == 0
    assert f"parameters: {numel:,}\n" in tool and f"parameters without embeddings: {expected.no_embedding:,}\n" in tool
    assert expected.total == numel
    assert sorted(ranks) == list(range(num_ranks))
    for rank, r in ranks.items():
        assert (r["parameters"], r["parameters_no_embedding"]) == (numel, expected.no_embedding), f"rank {rank}"
        assert r["components"] == expected.components, f"rank {rank}"
        assert [tuple(s) for s in r["stages"]] == [tuple(s) for s in expected.stages], f"rank {rank}"
        assert r["count_calls"] == 1
    out = proc.stdout
    assert f"model parameters (exact): {numel:,} total, {expected.no_embedding:,} without embeddings" in out
    assert f"architecture: {shape.describe()}\n" in out
    assert "disagrees with the analytic formula" not in out
    curve = losses(out)
    assert sorted(curve) == list(range(1, ITERS + 1)) and curve[ITERS] < curve[1], curve
    return shape


def test_llama_tp2_pp2_counts_resumes_exactly_and_refuses_another_variant(tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = flags_for(LLAMA, 2, 2, "--save", ckpt, "--save-interval", 3)
    proc, whole = launch(4, flags, str(tmp_path / "whole"))
    shape = check_counts(proc, whole, flags, 4)
    assert shape.describe() == "rotary, swiglu ffn 128, rmsnorm, 4 query / 2 kv heads, untied, qkv bias only"
    # as if the run had stopped after iteration 3: the pointers name the checkpoint of iteration 3
    (ckpt / "latest").write_text("global_step3")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    proc, resumed = launch(4, flags + ["--load", ckpt], str(tmp_path / "resumed"))
    assert f"loaded checkpoint {ckpt}/global_step3/" in proc.stdout
    last = resumed[3]["losses"]  # the last pipeline stage logs the loss
    assert sorted(map(int, last)) == [4, 5, 6]
    for it in (4, 5, 6):
        assert last[str(it)] == pytest.approx(whole[3]["losses"][str(it)], rel=1e-6, abs=0), f"iteration {it}"
    # the GPT-2 of the same sizes and layout: refused before any model is built, both variants named
    proc, _ = launch(4, flags_for([], 2, 2, "--load", ckpt), str(tmp_path / "gpt2"), check=False)
    assert proc.returncode != 0
    message = re.search(r"pretrain_gpt.py: error: --load .*", proc.stdout).group(0)
    for field, saved, now in (("position_embedding_type", "rotary", "absolute"), ("glu_activation", "swiglu", None),
                              ("ffn_hidden_size", 128, 256), ("normalization", "rmsnorm", "layernorm"),
                              ("num_key_value_heads", 2, 4), ("untie_embeddings_and_output_weights", True, False),
                              ("add_bias_linear", False, True), ("add_qkv_bias", True, False)):
        assert f"{field}: saved {saved} vs now {now}" in message
    assert "model parameters (exact)" not in proc.stdout
    # resharded to TP=1 x PP=1 (the fused QKV's kv groups and the SwiGLU halves of both TP ranks
    # merged): the first resumed loss is the one the run that never stopped computed on that batch
    (ckpt / "latest").write_text("global_step3")  # the resumed run above saved iteration 6
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    proc, tp1 = launch(1, flags_for(LLAMA, 1, 1, "--load", ckpt, "--exit-interval", 4), str(tmp_path / "tp1"))
    (ckpt / "latest").write_text("global_step6")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("6")
    assert "resuming TP=2 x PP=2 checkpoint" in proc.stdout and "at TP=1 x PP=1: resharding" in proc.stdout
    assert tp1[0]["losses"]["4"] == pytest.approx(whole[3]["losses"]["4"], rel=0, abs=1e-5)

    # exported to transformers as Qwen2ForCausalLM (GQA, untied, the QKV bias of both TP ranks
    # merged): our logits, the trainer's count
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM
    proc = convert("--load", ckpt, "--output", tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr
    count = whole[0]["parameters"]
    assert "to Qwen2ForCausalLM" in proc.stdout and f"parameters: {count:,} (" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.num_parameters() == count
    assert (model.config.num_key_value_heads, model.config.tie_word_embeddings) == (2, False)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    [ours] = run_distributed(1, our_logits, str(ckpt), tokens)
    with torch.no_grad():
        theirs = model(tokens).logits
    assert theirs.shape == ours.shape == (2, 32, VOCAB)
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-5), (theirs - ours).abs().max()


def test_bloom_tp2_pp2_counts_and_exports_to_bloom(tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = flags_for(BLOOM, 2, 2, "--save", ckpt)
    proc, ranks = launch(4, flags, str(tmp_path / "run"))
    shape = check_counts(proc, ranks, flags, 4)
    assert shape.describe() == "alibi, gelu ffn 192, embed layernorm, layernorm, 6 heads, tied"

    # transformers' own BLOOM (its ALiBi slopes for 6 heads, its embedding LayerNorm, its GeLU) on
    # the trained weights: our logits, up to the tanh-approximate GeLU BLOOM uses (ours is exact)
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM
    proc = convert("--load", ckpt, "--output", tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr
    count = ranks[0]["parameters"]
    assert "to BloomForCausalLM" in proc.stdout and f"parameters: {count:,} (" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "BloomForCausalLM" and model.num_parameters() == count
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    [ours] = run_distributed(1, our_logits, str(ckpt), tokens)
    with torch.no_grad():
        theirs = model(tokens).logits
    assert theirs.shape == ours.shape == (2, 32, VOCAB)
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-4), (theirs - ours).abs().max()
    assert (theirs - ours).abs().max() < 1e-2 * ours.std()  # far below what a wrong slope or sign gives


def test_mqa_glu_pp2_counts(tmp_path):
    flags = flags_for(MQA_GLU, 1, 2)
    proc, ranks = launch(2, flags, str(tmp_path))
    shape = check_counts(proc, ranks, flags, 2)
    assert shape.describe() == "rotary, geglu ffn 100, layernorm, 4 query / 1 kv heads of dim 24, tied"
