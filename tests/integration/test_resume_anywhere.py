"""Resume anywhere: a bf16 + ZeRO-1 checkpoint of the pipeline engine continues at another
TP x PP x DP layout with just --load, DeepSpeed's own ds_to_universal.py converts our
checkpoints and --universal-checkpoint loads its output, and every unsupported change is one
line, exit code 2, before the model is built, with the source checkpoint untouched.

One bf16 run at TP=2 x PP=2 x DP=1 (iterations 1-4 of a 6-iteration schedule, saves at 2 and 4)
is the uninterrupted reference; the resumed runs start from its iteration-2 checkpoint.

bf16 tolerance: the resumed bf16 weights are bit for bit the casts of the same fp32 masters
(asserted exactly below), but the forward pass rounds every matmul's output to bf16 (8-bit
mantissa), and how a product is split over TP ranks and then summed changes that rounding: the
two layouts' losses on one batch differ by ~1e-4 here. 2e-3 is ~10x that and far below what a
lost Adam state or a misplaced slice does to the loss (tenths).
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.support.checkpoint_copies import checkpoint_at, digest, log_lines
from tests.support.distributed import run_distributed
from tests.support.launcher import TINY, launch, losses

BF16 = TINY + ["--bf16", "--zero-stage", "1", "--global-batch-size", "4", "--train-iters", "6"]
BF16_TOL = 2e-3
VOCAB, PADDED_TP2 = 600, 768  # TINY's 600 tokens pad to 768 at TP=2 (640 at TP=1)


def layout(tp, pp):
    return ["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp]


def ds_to_universal(step_dir, out_dir):
    """DeepSpeed's own converter script, as installed, run as a user runs it."""
    import deepspeed
    script = os.path.join(os.path.dirname(deepspeed.__file__), "checkpoint", "ds_to_universal.py")
    proc = subprocess.run([sys.executable, script, "--input_folder", step_dir, "--output_folder", out_dir,
                           "--num_extract_workers", "1", "--num_merge_workers", "1"],
                          capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def universal(out_dir, name, state):
    return torch.load(os.path.join(out_dir, "zero", name, f"{state}.pt"), weights_only=False)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16")
    ckpt = str(tmp / "ckpt")
    proc, ranks = launch(4, BF16 + layout(2, 2) + ["--save", ckpt, "--save-interval", 2, "--exit-interval", 4],
                         str(tmp / "out"))
    at2 = checkpoint_at(ckpt, 2, str(tmp / "at2"))
    # DeepSpeed's converter reads the source and writes only into its output folder
    ds_to_universal(os.path.join(at2, "global_step2"), str(tmp / "universal" / "global_step2_universal"))
    return {"at2": at2, "digest2": digest(at2), "last": ranks[3], "log": log_lines(proc.stdout),
            "universal": str(tmp / "universal" / "global_step2_universal"), "tmp": tmp}


def _continues(resumed, reference, iterations, tol):
    for it in iterations:
        assert resumed["losses"][str(it)] == pytest.approx(reference["losses"][str(it)], rel=0, abs=tol), it


@pytest.fixture(scope="module")
def dp2(original):
    """Resumed at TP=1 x PP=1 x DP=2, trained to 6 with saves at 4 and 6."""
    tmp = original["tmp"] / "dp2"
    ckpt = str(tmp / "ckpt")
    os.environ["DRIVER_DUMP_LOADED"] = "1"  # the driver dumps what --load put into the engine
    try:
        proc, ranks = launch(2, BF16 + ["--load", original["at2"], "--save", ckpt, "--save-interval", 4],
                             str(tmp / "out"))
    finally:
        del os.environ["DRIVER_DUMP_LOADED"]
    loaded = torch.load(tmp / "out" / "rank0_loaded.pt", weights_only=False)
    return {"proc": proc, "rank": ranks[0], "ckpt": ckpt, "log": log_lines(proc.stdout), "tmp": tmp, "loaded": loaded}


def test_bf16_zero1_tp2_pp2_resumes_at_tp1_pp1_dp2(original, dp2):
    out, rank = dp2["proc"].stdout, dp2["rank"]
    assert (f"resuming TP=2 x PP=2 checkpoint {original['at2']}/global_step2 at TP=1 x PP=1: resharding weights and "
            f"optimizer state (DP=1 -> DP=2)") in out
    # the padded rows enter the softmax: kept as saved (768 = 3 x 256), not re-padded to 640
    assert f"vocabulary kept padded to {PADDED_TP2} as saved" in out and rank["padded_vocab_size"] == PADDED_TP2
    _continues(rank, original["last"], (3, 4), BF16_TOL)
    for it in (3, 4):  # data position and LR schedule: consumed samples 4 per iteration, the same LR
        assert dp2["log"][it][0] == original["log"][it][0] == 4 * it
        assert dp2["log"][it][1] == pytest.approx(original["log"][it][1], rel=1e-12)
    assert digest(original["at2"]) == original["digest2"]


def test_bf16_zero1_resumes_at_tp2_pp1_dp2(original):
    tmp = original["tmp"] / "tp2dp2"
    proc, ranks = launch(4, BF16 + layout(2, 1) + ["--load", original["at2"], "--exit-interval", 4], str(tmp))
    assert "at TP=2 x PP=1: resharding weights and optimizer state (DP=1 -> DP=2)" in proc.stdout
    _continues(ranks[3], original["last"], (3, 4), BF16_TOL)
    assert ranks[3]["gigaflos_no_embeds"] == pytest.approx(original["last"]["gigaflos_no_embeds"], rel=1e-12)
    assert digest(original["at2"]) == original["digest2"]


def in_process(flags, capsys):
    """pretrain_gpt.main on one rank in this process (the entry_point fixture's world of one):
    (stdout, progress), without a launch's start-up cost."""
    import pretrain_gpt
    capsys.readouterr()
    _, progress = pretrain_gpt.main([str(f) for f in flags])
    return capsys.readouterr().out, progress


def test_bf16_zero1_saved_at_dp2_resumes_at_dp1_zero0(dp2, entry_point, capsys):
    src = checkpoint_at(dp2["ckpt"], 4, str(dp2["tmp"] / "at4"))
    before = digest(src)
    # DeepSpeed alone would stop here with a ZeRORuntimeException traceback (DP world size 2 vs 1);
    # and with ZeRO 0, where the pipeline engine's bf16 optimizer is DeepSpeed's BF16_Optimizer
    out, progress = in_process(BF16 + ["--zero-stage", 0, "--load", src], capsys)
    assert "resharding weights and optimizer state (ZeRO stage 1 -> 0, DP=2 -> DP=1)" in out
    curve = losses(out)
    assert sorted(curve) == [5, 6]
    for it in (5, 6):
        assert curve[it] == pytest.approx(dp2["rank"]["losses"][str(it)], rel=0, abs=BF16_TOL), it
    assert progress.gigaflos_no_embeds == pytest.approx(dp2["rank"]["gigaflos_no_embeds"], rel=1e-12)
    assert digest(src) == before


def test_resumed_masters_and_moments_are_the_saved_ones_exactly(original, dp2):
    """TP=2 x PP=2 x DP=1 -> TP=1 x PP=1 x DP=2: every fp32 master and Adam moment the resumed engine
    holds (gathered over its 2 DP ranks by DeepSpeed's safe_get_full_* API) equals the tensor
    DeepSpeed's ds_to_universal.py gathered from the saved partitions (an implementation
    independent of ours), bit for bit; the bf16 weights are their casts."""
    state, steps = dp2["loaded"]["params"], dp2["loaded"]["steps"]
    assert dp2["loaded"]["iteration"] == 2 and steps and all(float(s) == 2.0 for s in steps)
    names = sorted(os.listdir(os.path.join(original["universal"], "zero")))
    assert sorted(state) == sorted(n for n in names if n != "optimizer_state.pt")
    for name, tensors in state.items():
        saved = {k: universal(original["universal"], name, k)["param"] for k in ("fp32", "exp_avg", "exp_avg_sq")}
        for key, tensor in saved.items():
            assert torch.equal(tensors[key], tensor), (name, key)
        assert torch.equal(tensors["weight"], saved["fp32"].to(torch.bfloat16)), name
        assert universal(original["universal"], name, "step") == 2
    embedding = state["tied_modules.embed.word_embeddings.weight"]["fp32"]
    assert embedding.shape[0] == PADDED_TP2 and embedding[VOCAB:].abs().sum() > 0  # padded rows kept, trained
    assert digest(original["at2"]) == original["digest2"]


def test_deepspeed_universal_checkpoint_resumes_at_another_layout(original, entry_point, capsys):
    """DeepSpeed's ds_to_universal.py output (converted in the fixture), then --universal-checkpoint
    at TP=1 x PP=1 x DP=1: DeepSpeed cuts the slices and partitions itself."""
    load = original["tmp"] / "universal"
    (load / "latest_universal").write_text("global_step2_universal")
    out, progress = in_process(BF16 + ["--load", load, "--universal-checkpoint", "--exit-interval", 4], capsys)
    assert f"resuming DeepSpeed universal checkpoint {load}/global_step2_universal at TP=1 x PP=1 x DP=1" in out
    assert f"vocabulary kept padded to {PADDED_TP2} as saved" in out
    curve = losses(out)
    for it in (3, 4):
        assert curve[it] == pytest.approx(original["last"]["losses"][str(it)], rel=0, abs=BF16_TOL), it
    assert log_lines(out)[3] == pytest.approx(original["log"][3], rel=1e-12)
    assert progress.gigaflos_no_embeds == pytest.approx(original["last"]["gigaflos_no_embeds"], rel=1e-12)
    assert digest(original["at2"]) == original["digest2"]


def _refused(entry_point, flags, src, built_before=0):
    before = digest(src)
    code, lines, builds = entry_point([str(f) for f in flags])
    assert code == 2 and len(lines) == 1 and lines[0].startswith("pretrain_gpt.py: error: "), lines
    assert len(builds) == built_before, "the model was built before the error"
    assert digest(src) == before
    return lines[0]


def test_unsupported_changes_are_one_line_before_the_model(original, entry_point, tmp_path):
    at2 = original["at2"]
    fp32 = [f for f in BF16 if f != "--bf16"]
    line = _refused(entry_point, fp32 + ["--load", at2], at2)
    assert line.endswith("the checkpoint was saved in bf16, this run trains in fp32; launch with the saved "
                         "precision (--bf16)")
    # bf16 without ZeRO on the non-pipeline engine is DeepSpeed's FP16_Optimizer
    line = _refused(entry_point, BF16 + ["--zero-stage", 0, "--no-pipeline-parallel", "--load", at2], at2)
    assert "FP16_Optimizer keeps flat fp32 copies without parameter names); use --zero-stage 1" in line
    line = _refused(entry_point, BF16 + ["--zero-stage", 3, "--no-pipeline-parallel", "--load", at2], at2)
    assert "ZeRO stage 3 partitions the weights too" in line
    line = _refused(entry_point, BF16 + ["--zero-stage", 0, "--load", original["tmp"] / "universal",
                                         "--universal-checkpoint"], at2)
    assert "DeepSpeed loads universal checkpoints into ZeRO's optimizer only" in line and "--zero-stage 1" in line
    universal_dir = original["tmp"] / "universal"
    (universal_dir / "latest_universal").write_text("global_step2_universal")
    line = _refused(entry_point, BF16 + ["--no-pipeline-parallel", "--load", universal_dir, "--universal-checkpoint"],
                    at2)
    assert "saved with the pipeline engine, whose parameter names this engine does not have" in line
    line = _refused(entry_point, BF16 + ["--load", at2, "--universal-checkpoint"], at2)
    assert f"{at2}/latest_universal is missing; convert with DeepSpeed's ds_to_universal.py" in line


def test_moe_change_of_layout_is_one_line(entry_point, tmp_path):
    """An MoE checkpoint (saved in-process, one rank, ZeRO 0) resumed with ZeRO 1: refused."""
    moe = ["--num-experts", 2, "--expert-interval", 1, "--no-pipeline-parallel", "--global-batch-size", 2,
           "--train-iters", 1]
    ckpt = tmp_path / "moe"
    import pretrain_gpt
    pretrain_gpt.main([str(f) for f in TINY + moe + ["--save", ckpt]])  # one build, counted below
    assert glob.glob(str(ckpt / "global_step1" / "*expert*"))
    line = _refused(entry_point, TINY + moe + ["--load", ckpt, "--zero-stage", 1, "--create-moe-param-group"], ckpt,
                    built_before=1)  # the saving run's build
    assert "resuming a mixture-of-experts checkpoint (TP=1 x PP=1, no pipeline engine x DP=1, ZeRO 0)" in line
    assert "is not supported; resume at the saved layout and ZeRO stage" in line
    shutil.rmtree(ckpt)


def test_bf16_pipeline_checkpoint_resumes_on_the_non_pipeline_engine_with_zero2(original, entry_point,
                                                                               capsys):
    """One rank: the pipeline engine's TP=2 x PP=2 ZeRO-1 checkpoint continues on the
    --no-pipeline-parallel engine with ZeRO 2 (other parameter names, gradients partitioned too)."""
    at2 = original["at2"]
    out, _ = in_process(BF16 + ["--no-pipeline-parallel", "--zero-stage", 2, "--load", at2, "--exit-interval", 3],
                        capsys)
    assert ("at TP=1 x PP=1, no pipeline engine: resharding weights and optimizer state (ZeRO stage 1 -> 2)"
            in out)
    assert losses(out)[3] == pytest.approx(original["last"]["losses"]["3"], rel=0, abs=BF16_TOL)
    assert digest(at2) == original["digest2"]


def _names_and_tags():
    """Every variant on both engines at TP=1 x PP=1: each built parameter's name and its TP tags."""
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel, GPTModelPipe
    from megatron.model.shape import ModelShape
    from tests.support.variants import VARIANTS, shape_kwargs
    out = {}
    for name in VARIANTS:
        config = GPTConfig(ModelShape(**shape_kwargs(name)))
        for pipeline in (True, False):
            model = GPTModelPipe(config, topology=mpu.get_topology()) if pipeline else GPTModel(config)
            out[(name, pipeline)] = {n: (getattr(p, "tensor_model_parallel", False), getattr(p, "partition_dim", None))
                                     for n, p in model.named_parameters()}
    return out


def test_universal_checkpoint_info_names_every_built_parameter_by_its_tp_split():
    """The patterns (written from the parameter table) against the built modules' own TP tags:
    each TP-replicated parameter matches exactly one replicated pattern, each row-parallel one
    (split on dim 1) one row pattern, and nothing else matches either."""
    import re

    from deepspeed.checkpoint import constants as c

    from megatron.checkpoint.universal import universal_checkpoint_info
    from megatron.model.shape import ModelShape
    from tests.support.variants import shape_kwargs
    [built] = run_distributed(1, _names_and_tags)
    for (name, pipeline), params in built.items():
        info = universal_checkpoint_info(ModelShape(**shape_kwargs(name)), pipeline)
        for param, (split, dim) in params.items():
            replicated = [p for p in info[c.TP_REPLICATED_PARAMETER_PATTERNS] if re.match(p, param)]
            rows = [p for p in info[c.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS] if re.match(p, param)]
            assert len(replicated) == (0 if split else 1), (name, pipeline, param, replicated)
            assert len(rows) == (1 if split and dim == 1 else 0), (name, pipeline, param, rows)
        tied_copy = [p for p in params if re.match(r"^tied_modules\.embed\.", p)]
        assert bool(info[c.PIPELINE_REPLICATED_PARAMETER_PATTERNS]) == bool(tied_copy)
