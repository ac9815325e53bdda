"""MFU: the peak table lookup and the formula (model FLOPs without recompute / time / world / peak)."""
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
from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
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


def test_formula_uses_model_flops_without_recompute():
    """The model FLOPs per sample are cached on args with the parameter counts (megatron/utils.py,
    once the model is built), without the recompute pass that args.flops_per_sample includes."""
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600)
    args = Namespace(model_shape=shape, checkpoint_activations=True, activations_checkpoint_method="uniform",
                     checkpoint_num_layers=1)
    cache_parameter_counts(args, analytic_parameter_counts(shape))
    settings = resolve_mfu("fp32", 2.0, device_name="cpu")
    assert "--peak-tflops 2" in settings.reason
    # s=32, h=64, f=256, L=2, V=640: 3 x 2 x (8sh^2 + 4s^2h + 4shf) + 6shV, no recompute pass
    s, h, f, v = 32, 64, 256, 640
    model_flops = 3 * 2 * (8 * s * h * h + 4 * s * s * h + 4 * s * h * f) + 6 * s * h * v
    assert args.model_flops_per_sample == model_flops == flops_per_sample(args.model_shape, False)
    assert model_flops < flops_per_sample(args.model_shape, True) == args.flops_per_sample
    mfu = interval_mfu(args.model_flops_per_sample, samples=80, elapsed=0.5, world_size=4,
                       peak_tflops=settings.peak_tflops_per_device)
    assert mfu == model_flops * 80 / 0.5 / 4 / 2e12
    assert model_flops_utilization(model_flops, 80, 0.5, 4, 2.0) == mfu
    settings = resolve_mfu("fp32", None, device_name="NVIDIA GeForce RTX 4090")
    assert interval_mfu(model_flops, 80, 0.5, 4, settings.peak_tflops_per_device) is None
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
