"""Every dense peak of the MFU table (TFLOP/s of one device, without structured sparsity), written
out here per device and dtype as megatron/metrics/mfu.py cites the vendors' datasheets, so that a changed
or mistyped number, or a dtype that goes missing, fails; tests/unit/test_mfu.py checks one dtype each."""
import pytest

from megatron.metrics.mfu import lookup_peak_tflops

DATASHEETS = [  # (CUDA device name, entry, {dtype: dense TFLOP/s})
    ("NVIDIA H100 PCIe", "H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("NVIDIA H200", "H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("NVIDIA A100-SXM4-80GB", "A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("NVIDIA B200", "B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("AMD Instinct MI250X", "MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7}),
    ("AMD Instinct MI300X", "MI300X", {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4}),
    ("NVIDIA L40S", "L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
]


@pytest.mark.parametrize("name, entry, peaks", DATASHEETS, ids=[d[1] for d in DATASHEETS])
def test_every_dtype_of_every_device(name, entry, peaks):
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        expected = (peaks[dtype], entry) if dtype in peaks else (None, f"{entry} has no {dtype} peak in the table")
        assert lookup_peak_tflops(name, dtype) == expected, dtype
