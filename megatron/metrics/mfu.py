"""Model FLOPs utilisation (torch-free): model FLOPs (no recompute) per second per device over the
device's dense peak.

TFLOPs in the log line keep Megatron-DeepSpeed's meaning (recompute included: hardware FLOPs);
MFU counts only the model's FLOPs, `flops_per_sample(shape, checkpoint_activations=False)`, so
runs with and without activation checkpointing, and other trainers, compare on one scale. Both
FLOPs per sample are computed once, when the model is built, and cached on `args` with the
parameter counts (megatron/utils.py: `flops_per_sample`, `model_flops_per_sample`); here are the
device's peak and the formula.
"""
from dataclasses import dataclass

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


def model_flops_utilization(model_flops_per_sample: float, samples: int, elapsed: float, world_size: int,
                            peak_tflops: float) -> float:
    """MFU = model FLOPs (no recompute) x samples / time / world size / peak."""
    return model_flops_per_sample * samples / elapsed / world_size / (peak_tflops * 1e12)


@dataclass(frozen=True)
class MfuSettings:
    peak_tflops_per_device: float | None  # None: no MFU (reason says why)
    reason: str                           # the startup line: which peak MFU is measured against


def resolve_mfu(precision: str, peak_tflops: float | None, device_name: str | None = None) -> MfuSettings:
    """The device's peak for the training precision (fp16, bf16, fp32): --peak-tflops, or the
    table for the CUDA device this rank uses (fp32 matmuls on TF32 when torch allows them).
    Resolved once, for the run configuration's logging section."""
    if device_name is None:
        import torch
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        tf32 = device_name is not None and torch.backends.cuda.matmul.allow_tf32
    else:
        tf32 = False
    dtype = "tf32" if precision == "fp32" and tf32 else precision
    peak, why = resolve_peak_tflops(peak_tflops, device_name, dtype)
    return MfuSettings(peak, why)


def with_flops_convention(mfu: MfuSettings, causal: bool) -> MfuSettings:
    """The startup line also says which FLOPs convention MFU's model FLOPs use (--flops-attention)."""
    if mfu.peak_tflops_per_device is None:
        return mfu
    convention = ("attention's s^2 terms halved for the causal mask (Megatron-LM's convention)" if causal else
                  "attention's s^2 terms in full (both forks' convention)")
    return MfuSettings(mfu.peak_tflops_per_device, f"{mfu.reason}; model FLOPs with {convention}")


def interval_mfu(model_flops_per_sample: float, samples: int, elapsed: float, world_size: int,
                 peak_tflops: float | None) -> float | None:
    """The logger's MFU over an interval, or None without a peak (MfuSettings.reason says why)."""
    if peak_tflops is None:
        return None
    return model_flops_utilization(model_flops_per_sample, samples, elapsed, world_size, peak_tflops)
