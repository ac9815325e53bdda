"""The forks' published launch scripts run unchanged (tests/data/published_scripts/*.txt: each
script's flags as it passes them to pretrain_gpt.py, its source in the file's first line): every
flag parses with the trainer's parser, and tools/param_count.py takes the whole list. Plus the
one-line errors that real scripts run into, the startup line naming the flags accepted with no
effect (and a run showing they change nothing), and --clip-grad under a ds_config."""
import contextlib
import io
import json
import os

import pytest

from tests.support.distributed import run_distributed
from tests.support.flag_runs import check_one_line, flags
from tests.support.published_scripts import SCRIPTS, for_the_tool, load, param_count_module, with_local_tokenizer

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
ROOT = os.path.dirname(HERE)
def test_the_collection():
    """Both forks, each family the README names: BLOOM (176B, 7b1), the 104B and 13B runs, the 1B3
    architecture experiments, LLaMA-2, MoE and PR-MoE, rotary-percent, flash attention, Ulysses and
    long sequences, universal checkpointing, GPT-3 175B on Azure; and the six of
    tests/integration/test_fork_features.py (recompute spellings, offload, distillation, zero bubble, FPDT, muP)."""
    assert len(SCRIPTS) == 29
    sources = {"/".join(open(p).readline().split("/")[3:5]) for p in SCRIPTS}
    assert sources == {"bigscience-workshop/bigscience", "bigscience-workshop/Megatron-DeepSpeed",
                       "microsoft/Megatron-DeepSpeed"}
    for path in SCRIPTS:
        argv = load(path)
        assert argv[0].startswith("--") and len(argv) > 40, path


@pytest.mark.parametrize("path", SCRIPTS, ids=[os.path.basename(p)[:-4] for p in SCRIPTS])
def test_every_flag_parses(path, capsys):
    from megatron.config.arguments import build_parser
    from megatron.config.validation import validate_flag_values
    argv = load(path)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(capsys.readouterr().err.strip().splitlines()[-1])
    validate_flag_values(args)  # every single-flag rule holds for the published values


# test_param_count_takes_the_whole_list: tests/unit/test_breakdowns_by_hand.py (each total worked out by hand)


def test_param_count_of_the_13b_script():
    """tr1-13B: 40 layers, hidden 5120, ffn 20480, seq 2048, TP 2; the bundled vocab's 8192 entries
    (a multiple of 128 x 2). Per layer: QKV 3h^2 + 3h, dense h^2 + h, MLP 2hf + f + h, two norms 4h."""
    tool = param_count_module()
    argv = load(os.path.join(HERE, "data", "published_scripts", "bigscience_tr1_13B.txt"))
    lines = tool.report(tool.parse_args(for_the_tool(argv)))
    h, f = 5120, 20480
    per_layer = 3 * h * h + 3 * h + h * h + h + 2 * h * f + f + h + 4 * h
    no_embedding = 40 * per_layer + 2 * h
    assert lines[:2] == [f"parameters: {no_embedding + (8192 + 2048) * h:,}",
                         f"parameters without embeddings: {no_embedding:,}"]


# --- one line before any heavy work ------------------------------------------------------------

ULYSSES_REFUSALS = [  # (flag changes, world size, the line's fix)
    ({"--ds-sequence-parallel-size": 2}, 2, "add --no-pipeline-parallel"),
    ({"--ds-sequence-parallel-size": 2, "--no-pipeline-parallel": None, "--tensor-model-parallel-size": 2}, 4,
     "use --tensor/--pipeline-model-parallel-size 1"),
    ({"--ds-sequence-parallel-size": 2, "--no-pipeline-parallel": None}, 3, "launch a multiple of 2 ranks"),
    ({"--ds-sequence-parallel-size": 8, "--no-pipeline-parallel": None}, 8, "must divide --seq-length (32), "
     "--num-attention-heads (4)"),
    ({"--ds-sequence-parallel-size": 4, "--no-pipeline-parallel": None, "--num-key-value-heads": 2}, 4,
     "the key/value heads (2)"),
    ({"--ds-sequence-parallel-size": 2, "--no-pipeline-parallel": None, "--zero-stage": 3}, 2,
     "runs with ZeRO stage 0, 1 or 2 (got 3)"),
    ({"--ds-sequence-parallel-size": 2, "--no-pipeline-parallel": None, "--num-experts": 2}, 2,
     "runs dense models only"),
]


@pytest.mark.parametrize("changes, world_size, fix", ULYSSES_REFUSALS)
def test_ulysses_layouts_it_does_not_run_in_are_one_line(entry_point, changes, world_size, fix):
    line = check_one_line(entry_point, flags(changes), world_size, "--ds-sequence-parallel-size")
    assert fix in line, line


def test_nccl_without_cuda_is_one_line(entry_point):
    line = check_one_line(entry_point, flags({"--distributed-backend": "nccl"}), 1, "--distributed-backend nccl")
    assert "needs CUDA devices" in line


@pytest.mark.parametrize("ranges, message", [
    (["5-3"], "--skip-train-iteration-range 5-3: needs 1 <= START <= END"),
    (["12"], "--skip-train-iteration-range 12: give START-END, e.g. 101-200"),
])
def test_bad_skip_range_is_one_line(ranges, message, entry_point):
    line = check_one_line(entry_point, flags({"--skip-train-iteration-range": ranges}), 1,
                          "--skip-train-iteration-range")
    assert line == f"pretrain_gpt.py: error: {message}"


def test_tp_sync_with_zero3_is_one_line(entry_point):
    line = check_one_line(entry_point, flags({"--sync-tp-duplicated-parameters": None, "--zero-stage": 3,
                                              "--no-pipeline-parallel": None}), 1, "--sync-tp-duplicated-parameters")
    assert "ZeRO stage 3" in line


def test_ds_config_key_deepspeed_rejects_is_one_line(entry_point, tmp_path):
    """A block DeepSpeed 0.19 removed (`amp`, Apex AMP) in an otherwise valid config. (The legacy
    `curriculum_learning` of Microsoft's MoE template is no longer one of them: the trainer takes
    it out and runs it, tests/integration/test_curriculum.py.) What the installed DeepSpeed says about it,
    asked directly:"""
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10,
              "zero_optimization": {"stage": 0}, "gradient_clipping": 1.0, "prescale_gradients": True,
              "amp": {"enabled": False}, "wall_clock_breakdown": False}
    with pytest.raises(Exception) as rejected:
        DeepSpeedConfig(config)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    line = check_one_line(entry_point, flags({"--deepspeed_config": path}), 1, "--deepspeed_config")
    assert line == (f"pretrain_gpt.py: error: --deepspeed_config {path}: DeepSpeed {deepspeed.__version__} "
                    f"rejects it: {str(rejected.value).splitlines()[0]}")
    assert "AMP" in line


def test_param_count_applies_the_trainers_rampup_rule(capsys):
    """The trainer refuses this ramp-up (test_flag_validation: "rampup vs micro x dp"); so does the tool."""
    tool = param_count_module()
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                   "--vocab-size", "600", "--micro-batch-size", "2", "--global-batch-size", "16",
                   "--rampup-batch-size", "4", "4", "100", "--num-gpus", "4"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "param_count.py: error: --rampup-batch-size: start batch 4 is not divisible by --micro-batch-size 2 x "
        "data-parallel size 4"]


# --- accepted with no effect: named once, and the run is the same -------------------------------

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters",
        "4", "--lr", "1e-3", "--mock-data", "--vocab-size", "600", "--log-interval", "1", "--eval-interval", "2",
        "--eval-iters", "1", "--seed", "7"]
NO_EFFECT = ["--use-flash-attn", "--codecarbon-dir", "codecarbon",
             "--abort-on-unmet-fused-kernel-constraints", "--no-async-tensor-model-parallel-allreduce",
             "--use-flash-attn-triton", "--use-flash-attn-v2", "--sequence-parallel",
             "--no-masked-softmax-fusion", "--DDP-impl", "local"]
# implemented flags passed with the same values, to show they are not in the line either
# (--no-query-key-layer-scaling: the softmax's dtype under --fp16 / --bf16; this run is fp32)
IMPLEMENTED = ["--log-level", "info", "--log-level-replica", "error", "--valid-num-workers", "0",
               "--ds-sequence-parallel-size", "1", "--no-query-key-layer-scaling"]


def _train(argv):
    import pretrain_gpt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pretrain_gpt.main(argv)
    return out.getvalue()


def _both(with_flags, without):
    return _train(with_flags), _train(without)


def test_no_effect_flags_are_named_once_and_change_nothing(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.launch import logged_iterations
    tensorboard = ["--tensorboard-dir", str(tmp_path / "tb"), "--log-optimizer-states-to-tensorboard"]
    with_flags, without = run_distributed(1, _both, TINY + NO_EFFECT + IMPLEMENTED + tensorboard, TINY)[0]
    line = ("accepted, no effect: --use-flash-attn, --codecarbon-dir, "
            "--abort-on-unmet-fused-kernel-constraints, --no-async-tensor-model-parallel-allreduce, "
            "--use-flash-attn-triton, --use-flash-attn-v2, "
            "--no-masked-softmax-fusion, --DDP-impl (docs/flags.md, 'Flags accepted with no effect', says why)")
    assert with_flags.splitlines().count(line) == 1
    assert "accepted, no effect" not in without
    runs = [logged_iterations(out) for out in (with_flags, without)]
    assert sorted(runs[0]) == [1, 2, 3, 4]
    for it in range(1, 5):  # same losses and gradient norms, iteration by iteration
        assert (runs[0][it]["lm loss"], runs[0][it]["grad norm"]) == (runs[1][it]["lm loss"], runs[1][it]["grad norm"])
    validation = [[ln for ln in out.splitlines() if "validation loss at" in ln] for out in (with_flags, without)]
    assert len(validation[0]) == 4 and validation[0] == validation[1]  # iterations 2, 4, the end, test
    # the optimizer states went to TensorBoard under the fork's tags, every log interval
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for name in ("variance", "variance_sqrt", "momentum", "weight"):
        for kind in ("l2", "l1", "abs_max"):
            assert [e.step for e in events.Scalars(f"optimizer/{name}_{kind}")] == [1, 2, 3, 4]
            assert [e.step for e in events.Scalars(f"optimizer/{name}_{kind} vs tokens")] == [128, 256, 384, 512]
    assert all(e.value > 0 for e in events.Scalars("optimizer/momentum_l2"))


# --- --clip-grad with a ds_config: DeepSpeed's clipping, as in both forks -------------------------

CLIP_FLAG = 0.05
STEP = ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
        "--micro-batch-size", 2, "--global-batch-size", 2, "--train-iters", 1, "--lr", 1.0, "--lr-decay-style",
        "constant", "--optimizer", "sgd", "--sgd-momentum", 0, "--weight-decay", 0, "--clip-grad", CLIP_FLAG,
        "--mock-data", "--vocab-size", 600, "--hidden-dropout", 0, "--attention-dropout", 0, "--eval-iters", 0]


def _one_step(config_path):
    """One SGD step at lr 1 without momentum: the update is the (clipped) gradient."""
    import torch

    import pretrain_gpt
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = initialize_megatron(args_list=[str(f) for f in STEP] + (
            ["--deepspeed_config", config_path] if config_path else []))
        trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    engine = trainer.engine
    before = [p.detach().clone() for p in engine.module.parameters()]
    engine.train()
    trainer.train_step()
    update = torch.stack([(p.detach() - b).norm()
                          for p, b in zip(engine.module.parameters(), before, strict=True)]).norm()
    return {"grad_norm": float(engine.get_global_grad_norm()), "update_norm": float(update),
            "lines": [ln for ln in out.getvalue().splitlines() if ln.startswith("--clip-grad")]}


def _three(no_clipping, absent):
    return _one_step(no_clipping), _one_step(absent), _one_step(None)


def test_clip_grad_under_a_ds_config_follows_the_forks(tmp_path):
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    no_clipping, absent = tmp_path / "no_clipping.json", tmp_path / "absent.json"
    no_clipping.write_text(json.dumps({"gradient_clipping": 0.0}))
    absent.write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    [(unclipped, default, flag_only)] = run_distributed(1, _three, str(no_clipping), str(absent))
    # gradient_clipping 0: nothing clips, --clip-grad 0.05 included; the update is the whole gradient
    grad = unclipped["grad_norm"]
    assert grad > 2 * CLIP_FLAG
    assert unclipped["update_norm"] == pytest.approx(grad, rel=1e-5)
    assert unclipped["lines"] == [f"--clip-grad {CLIP_FLAG} is not used: DeepSpeed clips at 0.0 (the ds_config's "
                                  f"gradient_clipping), as in Megatron-DeepSpeed"]
    # no gradient_clipping in the ds_config: DeepSpeed's own default clips (the same model and
    # data, so the same gradient as the unclipped run), not --clip-grad
    assert default["grad_norm"] == pytest.approx(grad, rel=1e-6)
    assert default["update_norm"] == pytest.approx(min(grad, GRADIENT_CLIPPING_DEFAULT), rel=1e-5)
    assert default["lines"] == [f"--clip-grad {CLIP_FLAG} is not used: DeepSpeed clips at "
                                f"{float(GRADIENT_CLIPPING_DEFAULT)} (the ds_config's gradient_clipping, absent: "
                                f"DeepSpeed default), as in Megatron-DeepSpeed"]
    # no ds_config at all: the flag is the only clipping there is
    assert flag_only["update_norm"] == pytest.approx(CLIP_FLAG, rel=1e-4)
    assert flag_only["lines"] == []


# --- --sync-tp-duplicated-parameters: TP ranks that drifted apart meet at their mean -------------

def _sync_at_tp2():
    import torch

    import pretrain_gpt
    from megatron import mpu
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    with contextlib.redirect_stdout(io.StringIO()):
        args = initialize_megatron(args_list=[str(f) for f in STEP] + [
            "--tensor-model-parallel-size", "2", "--no-pipeline-parallel", "--sync-tp-duplicated-parameters",
            "--log-level", "debug", "--log-level-replica", "error"])
        trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    engine = trainer.engine
    import logging

    from deepspeed.utils import logger as deepspeed_logger
    levels = {name: logger.getEffectiveLevel() for name, logger in (
        ("deepspeed", deepspeed_logger), ("megatron", logging.getLogger("megatron.training")))}
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    tokens, (labels, mask) = next(trainer.train_iter)
    named = dict(engine.module.named_parameters())
    duplicated = sorted(n for n, p in named.items() if not getattr(p, "tensor_model_parallel", False))
    in_sync = {n: p.detach().clone() for n, p in named.items()}
    with torch.no_grad():
        engine.module(tokens, labels, mask)
    unchanged = all(torch.equal(in_sync[n], p) for n, p in named.items())
    with torch.no_grad():  # TP rank 1 drifts: every duplicated parameter off by rank-1 noise
        for n in duplicated:
            if mpu.get_tensor_model_parallel_rank() == 1:
                named[n].add_(torch.randn(named[n].shape, generator=torch.Generator().manual_seed(3)))
        drifted = {n: named[n].detach().clone() for n in duplicated}
        engine.module(tokens, labels, mask)
    return {"levels": levels, "duplicated": duplicated, "unchanged_in_sync": unchanged, "drifted": drifted,
            "after": {n: named[n].detach().clone() for n in duplicated}}


def test_sync_tp_duplicated_parameters_averages_drifted_copies_and_log_levels():
    import logging

    import torch
    rank0, rank1 = run_distributed(2, _sync_at_tp2, tp=2)
    # --log-level debug on rank 0, --log-level-replica error on the other (the same launch)
    assert rank0["levels"] == {"deepspeed": logging.DEBUG, "megatron": logging.DEBUG}
    assert rank1["levels"] == {"deepspeed": logging.ERROR, "megatron": logging.ERROR}
    assert rank0["unchanged_in_sync"] and rank1["unchanged_in_sync"]  # copies that agree stay bit for bit
    # the norms, row-parallel biases and position table are what TP duplicates
    assert any(n.endswith("input_layernorm.weight") for n in rank0["duplicated"])
    assert any(n.endswith("dense.bias") for n in rank0["duplicated"])
    for n in rank0["duplicated"]:
        assert not torch.equal(rank0["drifted"][n], rank1["drifted"][n])
        mean = (rank0["drifted"][n] + rank1["drifted"][n]) / 2
        torch.testing.assert_close(rank0["after"][n], mean, rtol=0, atol=1e-6)
        assert torch.equal(rank0["after"][n], rank1["after"][n])


# --- --skip-train-iteration-range: the batches of the range are dropped, nothing is trained ------

SKIP_BASE = TINY[:TINY.index("--eval-interval")] + [
    "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0", "--lr-decay-style", "linear"]


def _train_all(argvs):
    return [_train(argv) for argv in argvs]


def test_skipped_iterations_train_nothing_and_drop_their_batches():
    """Reference without the skip path: LR 1e-3 for the first step, then 0 (linear decay over one
    iteration to --min-lr 0). Its iterations 2 and 3 change no parameter, so its iteration 4 is the
    model after one update on batch 4 — what skipping 2-3 must give (no dropout: same math)."""
    from tests.support.launch import logged_iterations
    skipping, reference = run_distributed(1, _train_all, [
        SKIP_BASE + ["--lr-decay-iters", "1000", "--skip-train-iteration-range", "3-3", "2-2"],
        SKIP_BASE + ["--lr-decay-iters", "1"]])[0]
    assert "skipping iterations 2 to 3 (--skip-train-iteration-range)" in skipping.splitlines()
    runs = [logged_iterations(out) for out in (skipping, reference)]
    assert sorted(runs[0]) == [1, 4] and sorted(runs[1]) == [1, 2, 3, 4]
    for it in (1, 4):
        assert runs[0][it]["lm loss"] == runs[1][it]["lm loss"]
        assert runs[0][it]["consumed samples"] == runs[1][it]["consumed samples"] == 4 * it
    assert runs[0][4]["learning rate"] > 0 == runs[1][4]["learning rate"]  # the skip's own LR did not go to 0


# --- --log-optimizer-states-to-tensorboard: Adam's moments, each partition once ------------------

def _optimizer_states(zero_stage):
    import torch

    import pretrain_gpt
    from megatron import mpu
    from megatron.metrics.optimizer_states import optimizer_state_norms
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    argv = [str(f) for f in STEP[:STEP.index("--optimizer")] + STEP[STEP.index("--weight-decay"):]]
    argv[argv.index("--global-batch-size") + 1], argv[argv.index("--train-iters") + 1] = "4", "2"
    argv[argv.index("--lr") + 1] = "1e-2"
    with contextlib.redirect_stdout(io.StringIO()):
        args = initialize_megatron(args_list=argv + ["--zero-stage", str(zero_stage), "--no-pipeline-parallel"])
        trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    engine = trainer.engine
    engine.train()
    for _ in range(2):
        trainer.train_step()
    values = optimizer_state_norms(engine, mpu)
    if zero_stage:
        return values
    # the same quantities straight from torch's AdamW, one flat float64 vector per kind
    state = engine.optimizer.state
    params = [p for p in engine.module.parameters()]
    flat = {"variance": torch.cat([state[p]["exp_avg_sq"].flatten() for p in params]).double()}
    flat["variance_sqrt"] = flat["variance"].sqrt()
    flat["momentum"] = torch.cat([state[p]["exp_avg"].flatten() for p in params]).double()
    flat["weight"] = torch.cat([p.detach().flatten() for p in params]).double()
    direct = {}
    for name, t in flat.items():
        direct.update({f"{name}_l2": float(t.norm()), f"{name}_l1": float(t.abs().sum()),
                       f"{name}_abs_max": float(t.abs().max())})
    return values, direct


def test_optimizer_states_are_adams_moments_each_partition_once():
    """DP=1 without ZeRO against torch's AdamW state read directly; ZeRO-1 at DP=2 (each rank holds
    half of the flat state) against the DP=1 run on the same global batches."""
    [(plain, direct)] = run_distributed(1, _optimizer_states, 0)
    assert len(plain) == 12 and plain["variance_l2"] > 0 and plain["momentum_abs_max"] > 0
    for name, value in direct.items():
        assert plain[name] == pytest.approx(value, rel=1e-4), name  # float32 norms, per tensor
    zero1 = run_distributed(2, _optimizer_states, 1)
    assert zero1[0] == zero1[1]
    for name, value in plain.items():
        assert zero1[0][name] == pytest.approx(value, rel=1e-4, abs=1e-12), name


# --- --valid-num-workers: the validation split's DataLoader workers --------------------------------

class WhoReads:
    """A dataset whose samples say who read them: 0 the main process, 1 + id a DataLoader worker."""
    def __len__(self):
        return 64

    def __getitem__(self, i):
        import numpy as np
        import torch
        info = torch.utils.data.get_worker_info()
        return {"text": np.full(33, 0 if info is None else 1 + info.id, dtype=np.int64)}


def _loader_workers(extra):
    from megatron.config.arguments import parse_args
    from megatron.config.run_config import DataSettings, EvaluationSettings
    from megatron.config.validation import validate_args
    from megatron.schedules.progress import TrainingProgress
    from megatron.training.data_iterators import build_data_iterators

    args = validate_args(parse_args(args_list=TINY + extra), world_size=1, cuda_available=False)
    train, valid, test = build_data_iterators(lambda a, n: (WhoReads(), WhoReads(), WhoReads()), args,
                                              DataSettings.from_args(args), EvaluationSettings.from_args(args),
                                              TrainingProgress(), lambda batch: batch["text"], total_iterations=4)
    # validation and test come as [(group name, iterator)] (one unnamed group without split paths)
    return [int(next(it).max()) for it in (train, valid[0][1], test[0][1])]


def _workers_for_each(extras):
    import multiprocessing
    multiprocessing.set_start_method("fork", force=True)  # cheap workers: no fresh interpreter each
    return [_loader_workers(extra) for extra in extras]


def test_valid_num_workers_is_the_validation_loaders():
    """[train, valid, test] readers: --valid-num-workers moves the validation split alone (as in
    BigScience); without it validation takes --num-workers."""
    [runs] = run_distributed(1, _workers_for_each, [[], ["--valid-num-workers", "1"], ["--num-workers", "1"],
                                                    ["--num-workers", "1", "--valid-num-workers", "0"]])
    assert runs == [[0, 0, 0], [0, 1, 0], [1, 1, 1], [1, 0, 1]]


def test_param_count_of_the_moe_script():
    """Microsoft's 125M MoE-64 script, unshrunk: 12 layers, hidden 768, seq 2048, 64 experts on every
    other layer (--expert-interval's default 2: 6 MoE layers), top-1; the bundled vocab's 8192 entries.
    A GPT-2 layer: QKV 3h^2 + 3h, dense h^2 + h, MLP 2hf + f + h (f = 4h), two norms 4h. An MoE layer
    holds 64 such MLPs and a bias-free gate h x 64; a token runs one of them."""
    tool = param_count_module()
    argv = load(os.path.join(HERE, "data", "published_scripts", "microsoft_moe_125M_MoE64.txt"))
    lines = tool.report(tool.parse_args(for_the_tool(argv)))
    h, f, experts = 768, 3072, 64
    attention_and_norms = 3 * h * h + 3 * h + h * h + h + 4 * h
    mlp, gate = 2 * h * f + f + h, h * experts
    no_embedding = 6 * (attention_and_norms + mlp) + 6 * (attention_and_norms + experts * mlp + gate) + 2 * h
    active = 6 * (attention_and_norms + mlp) + 6 * (attention_and_norms + mlp + gate) + 2 * h
    embeddings = (8192 + 2048) * h
    assert lines[:4] == [f"parameters: {no_embedding + embeddings:,}",
                         f"parameters without embeddings: {no_embedding:,}",
                         f"active parameters: {active + embeddings:,}",
                         f"active parameters without embeddings: {active:,}"]
    assert no_embedding + embeddings == 1_878_294_528


def test_param_count_of_the_llama2_script(sentencepiece_model):
    """Microsoft's LLaMA-2 script, unshrunk (TP=2 PP=2): 24 layers, hidden 2048, ffn 5504, 16 heads of
    128 with 4 kv heads, SwiGLU, RMSNorm, no biases, untied, rotary (no position table). Its tokenizer
    is the test's 320-piece SentencePiece model, padded to a multiple of 128 x TP 2: 512 rows, held by
    the word embedding and again by the output layer. Per layer: QKV h(ad + 2gd), dense h^2,
    SwiGLU h x 2f + f x h, two norms 2h."""
    tool = param_count_module()
    argv = load(os.path.join(HERE, "data", "published_scripts", "microsoft_llama2.txt"))
    lines = tool.report(tool.parse_args(for_the_tool(with_local_tokenizer(argv, None, sentencepiece_model))))
    h, f, d = 2048, 5504, 128
    per_layer = h * (16 * d + 2 * 4 * d) + h * h + h * 2 * f + f * h + 2 * h
    no_embedding = 24 * per_layer + h
    assert lines[:2] == [f"parameters: {no_embedding + 2 * 512 * h:,}",
                         f"parameters without embeddings: {no_embedding:,}"]
    assert no_embedding == 1_063_356_416
