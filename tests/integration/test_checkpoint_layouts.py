"""A checkpoint outlives its layout: resumed at another TP x PP layout it continues as the original
layout would have; converted to `transformers` it computes our logits and tokenizes as we do.

One TP=2 x PP=2 run on the bundled corpus (saving at iterations 2 and 4) serves every check; the
resumed runs start from copies of its iteration-2 checkpoint.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support.checkpoint_copies import checkpoint_at, digest, log_lines
from tests.support.distributed import run_distributed
from tests.support.hf_export import convert, our_logits
from tests.support.launcher import ROOT, launch

ITERS = 6


def args_for(corpus, tp=1, pp=1):
    # --make-vocab-size-divisible-by 1000: the bundled 8192-token vocab pads to 10000 at TP=2 but to
    # 9000 at TP=1, so resuming at TP=1 has to keep the saved padding
    return ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
            "--micro-batch-size", 2, "--global-batch-size", 4, "--train-iters", ITERS, "--lr", "3e-3",
            "--lr-warmup-iters", 1, "--lr-decay-style", "cosine", "--hidden-dropout", 0, "--attention-dropout", 0,
            "--log-interval", 1, "--eval-interval", 1000, "--eval-iters", 1, "--data-path", corpus,
            "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt", "--split", "90,10,0",
            "--make-vocab-size-divisible-by", 1000, "--tensor-model-parallel-size", tp,
            "--pipeline-model-parallel-size", pp]



@pytest.fixture(scope="module")
def original(corpus, tmp_path_factory):
    """TP=2 x PP=2 split by FLOPs, iterations 1-4 of a 6-iteration schedule, checkpoints at 2 and 4."""
    tmp = tmp_path_factory.mktemp("original")
    ckpt = str(tmp / "ckpt")
    proc, ranks = launch(4, args_for(corpus, 2, 2) + ["--save", ckpt, "--save-interval", 2, "--exit-interval", 4,
                                                     "--pp-partition-method", "flops"], str(tmp / "out"))
    at2 = checkpoint_at(ckpt, 2, str(tmp / "at2"))
    return {"ckpt": ckpt, "at2": at2, "digest": digest(ckpt), "digest2": digest(at2), "last": ranks[3],
            "log": log_lines(proc.stdout), "parameters": ranks[0]["parameters"], "tmp": tmp}


@pytest.fixture(scope="module")
def tp1_no_pipe(corpus, original):
    """Resumed at TP=1 x PP=1 with the --no-pipeline-parallel engine; saves at 4 and 6."""
    tmp = original["tmp"] / "tp1"
    ckpt = str(tmp / "ckpt")
    proc, ranks = launch(1, args_for(corpus) + ["--no-pipeline-parallel", "--load", original["at2"], "--save", ckpt,
                                                "--save-interval", 4], str(tmp / "out"))
    return {"ckpt": ckpt, "proc": proc, "rank": ranks[0], "log": log_lines(proc.stdout), "tmp": tmp}


def _assert_continues(resumed, reference, iterations):
    for it in iterations:
        assert resumed["losses"][str(it)] == pytest.approx(reference["losses"][str(it)], rel=0, abs=1e-5), it


def test_resume_tp2_pp2_at_tp1_pp1(original, tp1_no_pipe):
    out, rank = tp1_no_pipe["proc"].stdout, tp1_no_pipe["rank"]
    assert (f"resuming TP=2 x PP=2 checkpoint {original['at2']}/global_step2 at TP=1 x PP=1, no pipeline engine: "
            f"resharding weights and optimizer state") in out
    # 8192 tokens at TP=1 with divisor 1000 would pad to 9000; the saved 10000 is kept (2000 x 5)
    assert "vocabulary kept padded to 10000 as saved (--make-vocab-size-divisible-by 2000 at TP=1)" in out
    assert rank["padded_vocab_size"] == 10000 and rank["parameters"] == original["parameters"]
    assert sorted(map(int, rank["losses"])) == list(range(3, ITERS + 1))
    # iteration 3 checks the weights; iteration 4 the Adam moments and step of iteration 3's update
    _assert_continues(rank, original["last"], (3, 4))
    # data position (consumed samples) and LR schedule continue: same log values at 3 and 4
    for it in (3, 4):
        assert tp1_no_pipe["log"][it][0] == original["log"][it][0] == 4 * it
        assert tp1_no_pipe["log"][it][1] == pytest.approx(original["log"][it][1], rel=1e-12)
    # gigaflos: 6 x 4 samples x 32 tokens x non-embedding parameters per iteration, from 0 at iteration 0
    assert rank["gigaflos_no_embeds"] == pytest.approx(6 * 4 * ITERS * 32 * rank["parameters_no_embedding"] / 1e9,
                                                       rel=1e-12)
    assert digest(original["at2"]) == original["digest2"]  # the source is never written to


def test_resume_tp2_pp2_at_tp1_pp2(corpus, original):
    tmp = original["tmp"] / "tp1pp2"
    # the original's split balances FLOPs (--pp-partition-method flops): the logits (2 s h V, V = 10000) cost 12 layers,
    # so both layers sit on stage 0 and stage 1 holds the norm and output layer; this run splits
    # as DeepSpeed's type:transformer does, one layer per stage, so layer 2 moves to stage 1
    proc, ranks = launch(2, args_for(corpus, 1, 2) + ["--load", original["at2"], "--exit-interval", 4,
                                                      "--pp-partition-method", "type:transformer"], str(tmp))
    assert "resuming TP=2 x PP=2 checkpoint" in proc.stdout and "at TP=1 x PP=2: resharding" in proc.stdout
    assert "      1 | layer 2, norm, output layer " in proc.stdout
    assert json.load(open(os.path.join(original["ckpt"], "global_step2", "megatron_layout.json")))[
        "pp_partition_method"] == "flops"
    _assert_continues(ranks[1], original["last"], (3, 4))
    assert ranks[1]["gigaflos_no_embeds"] == pytest.approx(original["last"]["gigaflos_no_embeds"], rel=1e-12)
    assert log_lines(proc.stdout)[4] == pytest.approx(original["log"][4], rel=1e-12)
    assert digest(original["at2"]) == original["digest2"]


def test_resume_tp1_pp1_at_tp2_pp1(corpus, tp1_no_pipe):
    """The TP=1 (no pipeline engine) run's iteration-4 checkpoint, resumed by the pipeline engine at TP=2."""
    src = checkpoint_at(tp1_no_pipe["ckpt"], 4, str(tp1_no_pipe["tmp"] / "at4"))
    before = digest(src)
    proc, ranks = launch(2, args_for(corpus, 2, 1) + ["--load", src], str(tp1_no_pipe["tmp"] / "tp2"))
    assert f"resuming TP=1 x PP=1, no pipeline engine checkpoint {src}/global_step4 at TP=2 x PP=1" in proc.stdout
    assert sorted(map(int, ranks[1]["losses"])) == [5, 6]
    _assert_continues(ranks[1], tp1_no_pipe["rank"], (5, 6))
    assert ranks[1]["gigaflos_no_embeds"] == pytest.approx(tp1_no_pipe["rank"]["gigaflos_no_embeds"], rel=1e-12)
    assert digest(src) == before


def test_merged_tensors_are_the_saved_slices(original):
    """Independent of the cut: each saved TP shard is the contiguous block of the merged tensor."""
    from megatron.checkpoint.reshard import Checkpoint
    checkpoint = Checkpoint(original["ckpt"], 2)
    full = checkpoint.read_weights()
    assert set(full) == set(checkpoint.specs) and len(full) == 2 + 2 * 12 + 2  # embedding, 2 layers, final LN
    for (layer, key), tensor in full.items():
        spec = checkpoint.specs[(layer, key)]
        for tp_rank in range(2):
            path = os.path.join(checkpoint.step_dir, f"layer_{layer:02d}-model_{tp_rank:02d}-model_states.pt")
            shard = torch.load(path, weights_only=True)[key]
            if spec.partition_dim is None:
                assert torch.equal(shard, tensor)
            else:
                n = shard.shape[spec.partition_dim]
                assert torch.equal(shard, tensor.narrow(spec.partition_dim, tp_rank * n, n))


def test_reshard_refuses_a_parameter_the_table_lacks(original, tmp_path):
    """A saved parameter the parameter table has no entry for (in a layer file, or among the
    optimizer's parameter names) is refused in one line naming it, before anything is merged."""
    from megatron.checkpoint.reshard import Checkpoint
    from megatron.runtime.refusal import ConfigError
    broken = checkpoint_at(original["ckpt"], 2, str(tmp_path / "extra"))
    layer_file = os.path.join(broken, "global_step2", "layer_01-model_00-model_states.pt")
    weights = torch.load(layer_file, weights_only=True)
    torch.save({**weights, "self_attention.scale": torch.ones(4)}, layer_file)
    with pytest.raises(ConfigError) as error:
        Checkpoint(broken).read_weights()
    assert str(error.value) == (f"{layer_file}: parameters self_attention.scale of layer 1 are not in the "
                                f"parameter table of the saved shape")
    mp_file = os.path.join(broken, "global_step2", "mp_rank_00_model_states.pt")
    state = torch.load(mp_file, weights_only=False)
    assert state["optimizer_param_names"][0][0] == "tied_modules.embed.word_embeddings.weight"
    state["optimizer_param_names"][0][0] = "1.self_attention.scale"
    torch.save(state, mp_file)
    with pytest.raises(ConfigError) as error:
        Checkpoint(broken).read_optimizer()
    line = str(error.value)
    assert line.startswith("parameter 1.self_attention.scale has no entry in the parameter table "
                           "(megatron/model/analytic.py) of the model ") and "\n" not in line
    assert digest(original["ckpt"]) == original["digest"]


def test_convert_tp2_pp2_to_transformers(original):
    pytest.importorskip("transformers")  # the `hf` extra (installed by the `test` extra)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron.tokenizer import build_tokenizer
    hf_dir = original["tmp"] / "hf"
    proc = convert("--load", original["ckpt"], "--output", hf_dir)
    assert proc.returncode == 0, proc.stderr
    assert f"converted {original['ckpt']}/global_step4 (TP=2 x PP=2, iteration 4) to GPT2LMHeadModel" in proc.stdout
    # the trainer's count of this run (its "estimated model parameters")
    count = original["parameters"]
    assert f"parameters: {count:,} (estimated model parameters: {count / 1e9})" in proc.stdout

    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert type(model).__name__ == "GPT2LMHeadModel" and model.num_parameters() == count
    assert model.config.vocab_size == 10000 and model.config.layer_norm_epsilon == 1e-5
    tokens = torch.randint(0, 8192, (2, 32), generator=torch.Generator().manual_seed(0))
    [ours] = run_distributed(1, our_logits, original["ckpt"], tokens)
    with torch.no_grad():
        theirs = model(tokens).logits
    assert theirs.shape == ours.shape == (2, 32, 10000)
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-5), (theirs - ours).abs().max()

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    reference = build_tokenizer(type("Args", (), {"vocab_file": os.path.join(ROOT, "data/gpt2-vocab.json"),
                                                  "merge_file": os.path.join(ROOT, "data/gpt2-merges.txt"),
                                                  "tokenizer_type": None})())
    with open(os.path.join(ROOT, "data/corpus.jsonl")) as f:
        texts = [json.loads(line)["text"] for line in f]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids == reference.tokenize(text)
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == reference.eod
    assert digest(original["ckpt"]) == original["digest"]


def test_converter_bad_input_is_one_line_naming_the_path(original, tmp_path):
    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    broken = checkpoint_at(original["ckpt"], 2, str(tmp_path / "broken"))
    shard = os.path.join(broken, "global_step2", "layer_01-model_01-model_states.pt")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    before = digest(broken)
    cases = [
        (["--load", not_a_checkpoint], (f"--load {not_a_checkpoint}: not a checkpoint directory of this trainer "
                                        f"({not_a_checkpoint}/latest_checkpointed_iteration.txt is missing)")),
        (["--load", original["ckpt"], "--iteration", 3],
         f"--load {original['ckpt']}: {original['ckpt']}/global_step3 does not exist (saved iterations: 2, 4)"),
        (["--load", broken], (f"{shard}: checkpoint shard is unreadable (BadZipFile); the checkpoint is "
                              f"incomplete or corrupt")),
    ]
    for argv, message in cases:
        proc = convert(*argv, "--output", tmp_path / "hf")
        assert proc.returncode == 2
        assert proc.stderr == f"convert_checkpoint_to_hf.py: error: {message}\n"
        assert not (tmp_path / "hf").exists()
    assert digest(broken) == before
    assert digest(original["ckpt"]) == original["digest"]


def test_resume_refuses_a_truncated_shard_before_building(corpus, original, tmp_path):
    broken = checkpoint_at(original["ckpt"], 2, str(tmp_path / "broken"))
    shard = os.path.join(broken, "global_step2", "mp_rank_03_model_states.pt")
    with open(shard, "r+b") as f:
        f.truncate(100)
    before = digest(broken)
    proc, _ = launch(1, args_for(corpus) + ["--load", broken], str(tmp_path / "out"), check=False)
    assert proc.returncode != 0
    assert (f"pretrain_gpt.py: error: {shard}: checkpoint shard is unreadable (BadZipFile); the checkpoint is "
            f"incomplete or corrupt") in proc.stdout
    assert "estimated model parameters" not in proc.stdout  # failed before the model was built
    assert digest(broken) == before


def test_training_does_not_import_transformers():
    """transformers / safetensors are the `hf` extra: the trainer must run without them."""
    code = ("import sys, pretrain_gpt, megatron.training, megatron.checkpoint.manager, megatron.checkpoint.resume; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'safetensors')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu"))
    assert proc.stdout.strip().splitlines()[-1] == "[]"
