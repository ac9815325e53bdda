"""MFU: the peak table lookup, and the trainer's MFU of a model whose FLOPs are counted on a real
forward + backward (FlopCounterMode on transformers' GPT-2), over a stated interval and peak."""
from argparse import Namespace

import pytest

from megatron.metrics.mfu import (
    PEAK_TFLOPS,
    interval_mfu,
    lookup_peak_tflops,
    model_flops_utilization,
    resolve_mfu,
    resolve_peak_tflops,
)
from megatron.model.analytic import analytic_parameter_counts
from megatron.model.shape import ModelShape
from megatron.utils import cache_parameter_counts


@pytest.mark.parametrize("name,dtype,peak,entry", [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0, "A100"),
    ("NVIDIA A100-PCIE-40GB", "tf32", 156.0, "A100"),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4, "H100 SXM"),
    ("NVIDIA H100 PCIe", "fp16", 756.0, "H100 PCIe"),
    ("NVIDIA H200", "fp32", 66.9, "H200"),
    ("NVIDIA B200", "bf16", 2250.0, "B200"),
    ("AMD Instinct MI250X", "fp16", 383.0, "MI250X"),
    ("AMD Instinct MI300X", "tf32", 653.7, "MI300X"),
    ("NVIDIA L40S", "bf16", 362.05, "L40S"),
])
def test_lookup_by_cuda_device_name(name, dtype, peak, entry):
    assert lookup_peak_tflops(name, dtype) == (peak, entry)


def test_unknown_devices_and_dtypes_give_no_peak_and_say_why():
    assert lookup_peak_tflops("NVIDIA GeForce RTX 4090", "bf16")[0] is None
    assert lookup_peak_tflops("NVIDIA H100 NVL", "bf16")[0] is None  # other clocks: not guessed
    assert lookup_peak_tflops("AMD Instinct MI250X", "tf32") == (None, "MI250X has no tf32 peak in the table")
    peak, why = resolve_peak_tflops(None, None, "fp32")
    assert peak is None and "no MFU" in why and "--peak-tflops" in why and "\n" not in why
    assert resolve_peak_tflops(123.0, "NVIDIA H100 80GB HBM3", "bf16")[0] == 123.0  # the flag wins
    assert all(p > 0 for _, _, peaks in PEAK_TFLOPS for p in peaks.values())


def _counted_model_flops_per_sample():
    """FlopCounterMode on a real forward + backward of transformers' GPT-2 of the tiny model's sizes
    (2 layers, h 64, 4 heads, seq 32, vocab 640; eager attention: QK^T and PV are matmuls), over 2
    samples: an implementation that shares no code with ours, and no recompute."""
    transformers = pytest.importorskip("transformers")
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=640,
                                     attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    tokens = torch.randint(0, 640, (2, 32), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(tokens, labels=tokens).loss.backward()
    return counter.get_total_flops() // 2


def test_mfu_of_a_real_models_counted_flops():
    """The trainer's MFU for a run with activation checkpointing (its recompute pass is hardware
    FLOPs, not model FLOPs): the FLOPs cached on args at model build (megatron/utils.py), through the
    logger's interval_mfu, against FLOPs counted on a real forward + backward and a stated interval:
    80 samples in 0.5 s on 4 devices of a 2 TFLOP/s peak (--peak-tflops 2)."""
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600)
    args = Namespace(model_shape=shape, checkpoint_activations=True, activations_checkpoint_method="uniform",
                     checkpoint_num_layers=1)
    cache_parameter_counts(args, analytic_parameter_counts(shape))
    counted = _counted_model_flops_per_sample()
    # by hand, per sample: 3 x (2 layers x (QKV 6sh^2 + scores and context 4s^2h + projection 2sh^2 +
    # MLP 16sh^2) + logits 2shV) = 3 x (2 x 3,407,872 + 2,621,440)
    assert counted == 28_311_552
    assert args.model_flops_per_sample == counted  # the recompute pass is left out
    settings = resolve_mfu("fp32", 2.0, device_name="cpu")
    assert "--peak-tflops 2" in settings.reason
    # 28,311,552 x 80 samples / 0.5 s = 4,529,848,320 FLOP/s; over 4 devices 1,132,462,080 each;
    # over a 2e12 FLOP/s peak: 5.6623104e-4 exactly (27,648 / 48,828,125). Equal to the last bit: up
    # to the peak every step is exact in doubles, and one division rounds to the nearest double
    mfu = interval_mfu(args.model_flops_per_sample, samples=80, elapsed=0.5, world_size=4,
                       peak_tflops=settings.peak_tflops_per_device)
    assert mfu == 5.6623104e-4
    assert model_flops_utilization(counted, 80, 0.5, 4, 2.0) == 5.6623104e-4
    settings = resolve_mfu("fp32", None, device_name="NVIDIA GeForce RTX 4090")
    assert interval_mfu(counted, 80, 0.5, 4, settings.peak_tflops_per_device) is None
    # the training dtype picks the column: bf16 on an A100 is 312, fp32 without TF32 19.5
    assert resolve_mfu("bf16", None, device_name="NVIDIA A100-SXM4-80GB").peak_tflops_per_device == 312.0
    assert resolve_mfu("fp32", None, device_name="NVIDIA A100-SXM4-80GB").peak_tflops_per_device == 19.5


@pytest.mark.parametrize("value", ["0", "-5"])
def test_non_positive_peak_is_a_one_line_error_naming_the_flag(value):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.runtime.refusal import ConfigError
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--micro-batch-size", "2", "--lr", "1e-3", "--mock-data", "--vocab-size", "600", "--train-iters", "2",
             "--peak-tflops", value]
    with pytest.raises(ConfigError, match=rf"--peak-tflops {float(value)} must be positive") as info:
        validate_args(parse_args(args_list=flags), world_size=1, cuda_available=False)
    assert "\n" not in str(info.value)
