"""Every invalid flag combination fails early with one line naming the flag and the fix."""
import json
import re
import subprocess
import sys

import pytest

from megatron.config.arguments import parse_args
from megatron.config.validation import validate_args
from megatron.runtime.refusal import ConfigError
from tests.support.validated_args import BASE, validated


def test_seed_launch_script_flags_parse(tmp_path):
    """The user's script from the seed discussion (fp16 config swapped for fp32 on CPU)."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "train_batch_size": 16,
                                  "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
                                  "steps_per_print": 2000, "wall_clock_breakdown": False}))
    flags = ("--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 1024 "
             "--max-position-embeddings 1024 --micro-batch-size 1 --rampup-batch-size 2 2 1_000 "
             "--global-batch-size 16 --train-samples 100 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 "
             "--adam-eps 1e-8 --lr 1e-4 --lr-warmup-samples 5 --clip-grad 1.0 --weight-decay 1e-1 "
             "--partition-activations --seed 42 --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt "
             "--exit-interval 200 --log-interval 10 --save-interval 50 --eval-interval 100 --eval-iters 10 "
             "--checkpoint-activations --save ckpt --load ckpt --mock-data --tensorboard-dir tb "
             "--tensorboard-queue-size 5 --log-timers-to-tensorboard --log-batch-size-to-tensorboard "
             f"--log-validation-ppl-to-tensorboard --deepspeed --deepspeed_config {config} --zero-stage 1 "
             "--deepspeed-activation-checkpointing --tensor-model-parallel-size 2 "
             "--pipeline-model-parallel-size 1 --distributed-backend gloo --local_rank=0")
    args = validate_args(parse_args(args_list=flags.split()), world_size=2, cuda_available=False)
    assert args.rampup_batch_size == [2, 2, 1000]
    assert args.data_parallel_size == 1 and args.zero_stage == 1
    assert args.deepspeed_config_dict["train_batch_size"] == 16
    assert args.deepspeed_config_dict["gradient_accumulation_steps"] == 16


@pytest.mark.parametrize("extra, world_size, cuda, message", [
    (["--tensor-model-parallel-size", 3], 3, False,
     r"--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3"),
    (["--hidden-size", 66], 1, False, r"--hidden-size 66 is not divisible by --num-attention-heads 4"),
    (["--tensor-model-parallel-size", 2], 3, False,
     r"world size 3 is not divisible by --tensor-model-parallel-size 2 x --pipeline-model-parallel-size 1"),
    (["--pipeline-model-parallel-size", 8], 8, False,
     r"--num-layers 4 is smaller than --pipeline-model-parallel-size 8"),
    (["--global-batch-size", 6], 4, False,
     r"--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 4"),
    (["--fp16"], 1, False, r"--fp16 needs a CUDA device: on CPU train in fp32 \(drop --fp16\) or use --bf16"),
    (["--seq-length", 64], 1, False, r"--seq-length 64 exceeds --max-position-embeddings 32"),
    (["--optimizer", "lamb"], 1, False, r"--optimizer lamb is not supported: use adam or sgd"),
    (["--no-pipeline-parallel", "--pipeline-model-parallel-size", 2], 2, False,
     r"--no-pipeline-parallel needs --pipeline-model-parallel-size 1"),
    (["--fp16", "--bf16"], 1, True, r"--fp16 and --bf16 are exclusive"),
])
def test_invalid_layouts_fail_with_one_line(extra, world_size, cuda, message):
    with pytest.raises(ConfigError, match=message) as info:
        validated(extra, world_size, cuda)
    assert "\n" not in str(info.value)


SAMPLE_BASED = [a for a in BASE if a not in ("--train-iters", "10")] + ["--train-samples", "100"]


@pytest.mark.parametrize("rampup, world_size, message", [
    ([4, 3, 100], 1, r"--rampup-batch-size: global batch 8 minus start batch 4 is not divisible by the increment 3"),
    ([2, 2, 100], 2,
     r"--rampup-batch-size: start batch 2 is not divisible by --micro-batch-size 2 x data-parallel size 2"),
])
def test_rampup_that_does_not_divide(rampup, world_size, message):
    with pytest.raises(ConfigError, match=message):
        validated(["--rampup-batch-size"] + rampup, world_size=world_size, base=SAMPLE_BASED)


def test_missing_files_are_named(tmp_path):
    base = [a for a in BASE if a not in ("--mock-data", "--vocab-size", "600")]
    with pytest.raises(ConfigError, match=r"--data-path is required \(or pass --mock-data"):
        validated(base=base)
    with pytest.raises(ConfigError, match=r"--vocab-file nope.json: no such file"):
        validated(["--data-path", "x", "--vocab-file", "nope.json", "--merge-file", "data/gpt2-merges.txt"], base=base)
    missing = str(tmp_path / "corpus_text_document")
    with pytest.raises(ConfigError, match=r"--data-path .*corpus_text_document\.bin does not exist; "
                                          r"create it with tools/preprocess_data.py"):
        validated(["--data-path", missing, "--vocab-file", "data/gpt2-vocab.json",
                   "--merge-file", "data/gpt2-merges.txt"], base=base)


def test_ds_config_must_agree_with_flags(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}))
    with pytest.raises(ConfigError, match=r"train_batch_size=32 disagrees with --global-batch-size \(implies 8\)"):
        validated(["--deepspeed_config", config])
    config.write_text(json.dumps({"fp16": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"fp16.enabled=True disagrees with --fp16=False"):
        validated(["--deepspeed_config", config])


@pytest.mark.parametrize("zero, named", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "offload_optimizer (device cpu)"),
    ({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}, "offload_param (device nvme)"),
    ({"stage": 2, "cpu_offload": True}, "cpu_offload (device cpu)"),
    ({"stage": 3, "cpu_offload_param": True}, "cpu_offload_param (device cpu)"),
])
def test_zero_offload_is_one_line(tmp_path, zero, named):
    """DeepSpeed's engine would raise deep inside (ZeRO-Offload with a client optimizer); the
    sections saying "device": "none" (or false) stay accepted."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": zero}))
    with pytest.raises(ConfigError, match=rf"ds.json: zero_optimization\.{re.escape(named)}: ZeRO-Offload is not "
                                          r"supported by this trainer .*remove it or set its device to none$"):
        validated(["--deepspeed_config", config, "--no-pipeline-parallel"])
    config.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"},
                                                        "offload_param": {"device": "none"}}}))
    assert validated(["--deepspeed_config", config, "--no-pipeline-parallel"]).zero_stage == 3
    config.write_text(json.dumps({"zero_optimization": {"stage": 2, "cpu_offload": False}}))
    assert validated(["--deepspeed_config", config, "--no-pipeline-parallel"]).zero_stage == 2


def test_cli_error_is_one_line_before_any_heavy_work():
    """pretrain_gpt.py itself: exit code 2 and a single 'error:' line, no traceback."""
    cmd = [sys.executable, "pretrain_gpt.py"] + BASE + ["--fp16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1",
                               "PYTHONPATH": "."})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["pretrain_gpt.py: error: --fp16 needs a CUDA device: "
                      "on CPU train in fp32 (drop --fp16) or use --bf16"]
    assert "Traceback" not in proc.stderr


def test_optimizer_adamw_is_megatrons_adam_with_decoupled_weight_decay():
    """Argonne's `--optimizer adamw` is the optimizer Megatron's adam already is: AdamW. By hand, one
    step from zero gradients leaves Adam's moments at 0, so only the decoupled decay moves a weight:
    w (1 - lr wd) = 1 - 1e-3 x 0.1 = 0.9999 (Adam with an L2 term would see a gradient wd w and move
    it by ~lr: 0.999); biases are not decayed."""
    import torch

    from megatron.config.run_config import OptimizerSettings
    from megatron.runtime.precision import Precision
    from megatron.training.optimizer import build_optimizer
    args = validated(["--optimizer", "adamw", "--weight-decay", "0.1", "--bf16"])  # bf16: DeepSpeed clips
    assert args.optimizer == "adam"
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(1.0)
    optimizer = build_optimizer(model, OptimizerSettings.from_args(args), Precision.from_args(args))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.equal(model.weight, torch.full((2, 3), 1 - 1e-3 * 0.1))
    assert torch.equal(model.bias, torch.ones(2))
