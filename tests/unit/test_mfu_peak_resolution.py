"""Which peak MFU is measured against, as resolve_mfu picks it at startup (survivors of the mutation
run, benchmarks/mutation.sh): the one-line reason without a CUDA device, and the TF32 peak for fp32
training exactly when torch lets fp32 matmuls run on TF32. The CUDA device is torch's answer
(torch.cuda.is_available / get_device_name), replaced here by an A100's: this machine has none."""
import pytest
import torch

from megatron.metrics.mfu import MfuSettings, resolve_mfu


def test_no_cuda_device_no_mfu_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert resolve_mfu("fp32", None) == MfuSettings(
        None, "no MFU: no CUDA device; pass --peak-tflops <dense peak TFLOP/s of one device>")
    assert resolve_mfu("bf16", 7.5) == MfuSettings(7.5, "MFU against --peak-tflops 7.5 per device")


@pytest.fixture
def a100(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    old = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("precision,allow_tf32,peak,line", [
    ("fp32", True, 156.0, "MFU against the A100 dense tf32 peak, 156 TFLOP/s per device"),
    ("fp32", False, 19.5, "MFU against the A100 dense fp32 peak, 19.5 TFLOP/s per device"),
    ("bf16", True, 312.0, "MFU against the A100 dense bf16 peak, 312 TFLOP/s per device"),
])
def test_fp32_uses_the_tf32_peak_when_torch_allows_tf32(a100, precision, allow_tf32, peak, line):
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    assert resolve_mfu(precision, None) == MfuSettings(peak, line)
    # a device name given by the caller: no torch query, fp32 stays fp32
    assert resolve_mfu("fp32", None, device_name="NVIDIA A100-SXM4-80GB").peak_tflops_per_device == 19.5
