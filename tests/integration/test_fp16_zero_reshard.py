"""An fp16 + ZeRO-1 checkpoint resharded from DP=2 to DP=1 keeps its dynamic loss scaler exactly
(megatron/checkpoint/resume.py's load_resharded: read_loss_scaler, set_loss_scaler), with the fp32 masters and Adam's
moments of every parameter.

DeepSpeed's engine refuses fp16 on this CPU ("Type fp16 is not supported on your device": its CPU
accelerator asks oneDNN for fp16 kernels), and so does the trainer (--fp16 needs CUDA). The state is
built with DeepSpeed's own objects anyway: the accelerator is told fp16 is supported, so that
deepspeed.initialize builds its real fp16 DeepSpeedZeroOptimizer (torch computes fp16 on CPU, slowly),
which trains 6 steps from an initial scale of 2^20: the first steps overflow and are skipped, each
halving the scale (hysteresis 1; no growth within the window of 1000), then updates apply. The
checkpoint is written by the trainer's CheckpointManager, the DP=1 engine filled by the trainer's
resharding loader; the expected values are what DeepSpeed's source optimizer held (its loss scaler
object, and its full fp32 masters and moments gathered with deepspeed.utils' safe_get_full_* over
the DP ranks), not what our reader reads."""
import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY

STEPS, SCALE_POWER = 6, 20
ARGV = [str(a) for a in TINY + ["--bf16", "--zero-stage", 1, "--no-pipeline-parallel", "--micro-batch-size", 2,
                                "--train-iters", STEPS, "--eval-iters", 0]]
FP16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": SCALE_POWER, "loss_scale_window": 1000,
        "hysteresis": 1, "min_loss_scale": 1}
SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window", "min_scale",
                 "delayed_shift", "cur_hysteresis", "consecutive_hysteresis", "dynamic")


def _fp16_engine(global_batch_size, *extra):
    """The trainer's args (validated in bf16: fp16 is refused on CPU) and an fp16 ZeRO-1 engine."""
    import contextlib
    import io

    import deepspeed
    from deepspeed.accelerator import get_accelerator

    import pretrain_gpt
    from megatron import mpu
    from megatron.training.initialize import initialize_megatron
    get_accelerator().is_fp16_supported = lambda: True  # the engine's dtype check only (see the docstring)
    with contextlib.redirect_stdout(io.StringIO()):
        args = initialize_megatron(args_list=ARGV + ["--global-batch-size", str(global_batch_size), *extra])
    model = pretrain_gpt.model_provider(args)
    config = {k: v for k, v in args.deepspeed_config_dict.items() if k != "bf16"}
    config["fp16"] = FP16
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    assert engine.fp16_enabled() and engine.zero_optimization_stage() == 1
    return args, engine


def _scaler(engine):
    scaler = engine.optimizer.loss_scaler
    return {field: getattr(scaler, field) for field in SCALER_FIELDS} | {"class": type(scaler).__name__}


def _full_state(engine):
    """{name: (fp32 master, exp_avg, exp_avg_sq)}: whole tensors, gathered by DeepSpeed over DP."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    return {name: (safe_get_full_fp32_param(p).clone(), safe_get_full_optimizer_state(p, "exp_avg").clone(),
                   safe_get_full_optimizer_state(p, "exp_avg_sq").clone())
            for name, p in engine.module.named_parameters()}


def _source(save_dir):
    """DP=2: 6 fp16 steps, then the trainer's save."""
    from megatron import mpu
    from megatron.checkpoint.manager import CheckpointManager
    from megatron.schedules.learning_rates import AnnealingLR
    from megatron.schedules.progress import TrainingProgress
    args, engine = _fp16_engine(4, "--save", save_dir)
    g = torch.Generator().manual_seed(mpu.get_data_parallel_rank())
    applied = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 600, (2, 33), generator=g)
        loss = engine(tokens[:, :-1], tokens[:, 1:], torch.ones(2, 32))
        engine.backward(loss)
        engine.step()
        applied.append(engine.was_step_applied())
    progress = TrainingProgress(iteration=STEPS)
    CheckpointManager(args.run_config.checkpoint).save(
        engine, AnnealingLR(engine.optimizer, 1e-3, 0.0, 0, 100, "linear"), progress)
    return _scaler(engine), _full_state(engine), applied


def _resharded(save_dir):
    """DP=1: a fresh fp16 engine, filled by the resharding loader."""
    from megatron.checkpoint.reshard import Checkpoint
    from megatron.checkpoint.resume import load_resharded
    args, engine = _fp16_engine(2)
    before = _scaler(engine)
    load_resharded(engine, Checkpoint(save_dir, STEPS), args.run_config.checkpoint, args.model_shape,
                   pipeline=False, fp16=True)
    return before, _scaler(engine), _full_state(engine)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    save_dir = str(tmp_path_factory.mktemp("fp16") / "ckpt")
    source = run_distributed(2, _source, save_dir, timeout=600)
    [target] = run_distributed(1, _resharded, save_dir, timeout=600)
    return source, target


def test_the_source_overflowed_then_trained(runs):
    source, _ = runs
    (scaler, _, applied), (scaler1, _, applied1) = source
    assert scaler == scaler1 and applied == applied1  # every DP rank holds the same scaler
    # 2^20 x the gradients overflows fp16 (largest 65504): skipped steps, each halving the scale
    # (hysteresis 1), until updates apply
    skipped = applied.index(True)
    assert skipped >= 1 and all(applied[skipped:])
    assert scaler["cur_scale"] == 2.0 ** (SCALE_POWER - skipped)
    assert scaler["cur_iter"] == STEPS and scaler["last_overflow_iter"] == skipped - 1


def test_loss_scaler_survives_resharding_exactly(runs):
    source, (before, after, _) = runs
    scaler = source[0][0]
    assert before["cur_scale"] == 2.0 ** SCALE_POWER != scaler["cur_scale"]  # a fresh engine starts over
    assert after == scaler


def test_masters_and_moments_survive_resharding_exactly(runs):
    source, (_, _, state) = runs
    expected = source[0][1]
    assert sorted(state) == sorted(expected)
    for name, tensors in expected.items():
        for which, a, b in zip(("master", "exp_avg", "exp_avg_sq"), tensors, state[name], strict=True):
            assert torch.equal(a, b), (name, which)
    assert any(t[1].abs().sum() > 0 for t in expected.values())  # Adam has moved: the moments are not zeros
