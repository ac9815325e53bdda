"""Model FLOPs utilisation (torch-free): model FLOPs (no recompute) per second per device over the
device's dense peak.

TFLOPs in the log line keep Megatron-DeepSpeed's meaning (recompute included: hardware FLOPs);
MFU counts only the model's FLOPs, `flops_per_sample(shape, checkpoint_activations=False)`, so
runs with and without activation checkpointing, and other trainers, compare on one scale.
"""
from argparse import Namespace
from dataclasses import dataclass

from megatron.model.analytic import flops_per_sample
from megatron.model.shape import ModelShape

# Dense (no structured sparsity) peak TFLOP/s of one device, from the vendors' datasheets:
#   A100 (SXM and PCIe, 40/80 GB): NVIDIA A100 Tensor Core GPU datasheet
#   H100 SXM / H100 PCIe: NVIDIA H100 Tensor Core GPU datasheet (the sparse figures halved)
#   H200 (SXM): NVIDIA H200 datasheet (same compute as H100 SXM)
#   B200: NVIDIA HGX B200 / Blackwell datasheet, per GPU (the sparse figures halved)
#   MI250X, MI300X: AMD Instinct product pages (matrix peak; MI250X has no TF32)
#   L40S: NVIDIA L40S datasheet (fp16/bf16 with fp32 accumulate, sparse figures halved)
# Ordered: the first substring that matches the lower-cased device name wins.
PEAK_TFLOPS = (
    ("h100 pcie", "H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("h100", "H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("h200", "H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("a100", "A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("b200", "B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("mi250x", "MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
    ("mi300x", "MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    ("l40s", "L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
)
# variants with other clocks / power limits that the table does not cover: ask for --peak-tflops
_UNLISTED_VARIANTS = ("nvl", "h100 sxm5 64gb", "h800", "a800")


def lookup_peak_tflops(device_name: str | None, dtype: str) -> tuple[float | None, str]:
    """(peak TFLOP/s, table entry) for a CUDA device name and a training dtype (bf16, fp16,
    tf32, fp32), or (None, reason)."""
    if not device_name:
        return None, "no CUDA device"
    name = device_name.lower()
    if any(v in name for v in _UNLISTED_VARIANTS):
        return None, f"{device_name} is not in the peak table"
    for pattern, entry, peaks in PEAK_TFLOPS:
        if pattern in name:
            if dtype not in peaks:
                return None, f"{entry} has no {dtype} peak in the table"
            return peaks[dtype], entry
    return None, f"{device_name} is not in the peak table"


def resolve_peak_tflops(peak_flag: float | None, device_name: str | None, dtype: str) -> tuple[float | None, str]:
    """(peak TFLOP/s or None, one line saying where it came from or why there is no MFU)."""
    if peak_flag is not None:
        return peak_flag, f"MFU against --peak-tflops {peak_flag:g} per device"
    peak, entry = lookup_peak_tflops(device_name, dtype)
    if peak is None:
        return None, f"no MFU: {entry}; pass --peak-tflops <dense peak TFLOP/s of one device>"
    return peak, f"MFU against the {entry} dense {dtype} peak, {peak:g} TFLOP/s per device"


def model_flops_per_sample(shape: ModelShape) -> int:
    return flops_per_sample(shape, checkpoint_activations=False)


def model_flops_utilization(model_flops_per_sample: float, samples: int, elapsed: float, world_size: int,
                            peak_tflops: float) -> float:
    """MFU = model FLOPs (no recompute) x samples / time / world size / peak."""
    return model_flops_per_sample * samples / elapsed / world_size / (peak_tflops * 1e12)


@dataclass(frozen=True)
class MfuSettings:
    model_flops_per_sample: int
    peak_tflops_per_device: float | None  # None: no MFU (reason says why)
    reason: str                           # the startup line: which peak MFU is measured against


def resolve_mfu(args: Namespace, device_name: str | None = None) -> MfuSettings:
    """The model FLOPs per sample and the device's peak (--peak-tflops, or the table for the CUDA
    device this rank uses)."""
    if device_name is None:
        import torch
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        tf32 = device_name is not None and torch.backends.cuda.matmul.allow_tf32
    else:
        tf32 = False
    dtype = "fp16" if args.fp16 else ("bf16" if args.bf16 else ("tf32" if tf32 else "fp32"))
    peak, why = resolve_peak_tflops(args.peak_tflops, device_name, dtype)
    return MfuSettings(model_flops_per_sample(args.model_shape), peak, why)


def configure_mfu(args: Namespace, device_name: str | None = None) -> str:
    """The line saying which peak MFU is measured against. initialize_megatron resolves it once
    (args.run_config.mfu) and caches args.model_flops_per_sample / args.peak_tflops_per_device
    before args is frozen; args built without it (tests, tools) get both cached here."""
    run_config = getattr(args, "run_config", None)
    if run_config is not None and device_name is None:
        return run_config.mfu.reason
    settings = resolve_mfu(args, device_name)
    cache_mfu(args, settings)
    return settings.reason


def cache_mfu(args: Namespace, settings: MfuSettings) -> None:
    args.model_flops_per_sample = settings.model_flops_per_sample
    args.peak_tflops_per_device = settings.peak_tflops_per_device


def interval_mfu(samples: int, elapsed: float, args: Namespace) -> float | None:
    """The logger's MFU over an interval, or None without a peak (configure_mfu said why)."""
    peak = getattr(args, "peak_tflops_per_device", None)
    if peak is None:
        return None
    return model_flops_utilization(args.model_flops_per_sample, samples, elapsed, args.world_size, peak)
