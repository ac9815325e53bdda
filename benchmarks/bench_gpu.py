"""One-GPU throughput of the seed's 52M GPT in bf16: TFLOPs per GPU, MFU against the device's
datasheet peak (megatron/metrics/mfu.py) and against a measured bf16 GEMM ceiling, and memory predicted
(megatron/metrics/memory.py) vs measured after the first step. Needs CUDA; on a machine without it, says
so and exits with status 1.

The model is trained by our trainer built in-process (pipeline engine, TP=1 PP=1, as
`deepspeed pretrain_gpt.py --bf16` runs it) on mock data; steps are timed between CUDA
synchronisations after a warm-up. FLOPs per sample come from megatron.model.analytic.flops_per_sample,
the formula behind the trainer's "TFLOPs" log field.

Usage: python benchmarks/bench_gpu.py [--micro-batch 16] [--global-batch 16] [--steps 20]
"""
import argparse
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    sys.exit("bench_gpu.py: no CUDA device visible to torch; run it on a GPU machine "
             "(the CPU benchmarks are bench_overhead.py, bench_mfu.py and bench_layouts.py)")
os.environ.setdefault("DS_ACCELERATOR", "cuda")

import common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser, layers=8, hidden=512, heads=8, seq=1024, micro_batch=16, vocab=50257)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--peak-tflops", type=float, default=None, help="for a device not in megatron/metrics/mfu.py")
    a = parser.parse_args()

    extra = ["--bf16"] + (["--peak-tflops", str(a.peak_tflops)] if a.peak_tflops else [])
    ours = common.Trainer(common.trainer_flags(a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab,
                                               global_batch=a.global_batch, extra=extra))
    for _ in range(a.warmup):
        ours.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = ours.step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / a.steps
    gemm = common.gemm_flops(a.gemm_size, dtype=torch.bfloat16, device="cuda", reps=20)

    samples_per_second = a.global_batch / seconds
    achieved = ours.flops_per_sample * samples_per_second
    peak = ours.args.run_config.logging.mfu.peak_tflops_per_device  # the datasheet table, or --peak-tflops
    mfu = "-" if peak is None else f"{ours.args.model_flops_per_sample * samples_per_second / (peak * 1e12):.3f}"
    print(f"{torch.cuda.get_device_name()}: model {common.model_label(a)}, bf16, {ours.args.parameters:,} parameters, "
          f"global batch {a.global_batch}, {ours.flops_per_sample / 1e9:.0f} GFLOPs per sample; "
          f"{a.steps} steps after {a.warmup} warm-up, last loss {float(loss):.3f}")
    print(common.table(["", "ms / step", "tokens / s", "TFLOPs per GPU", "MFU (datasheet peak)",
                        "vs bf16 GEMM"], [
        (f"bf16 GEMM {a.gemm_size}^3 (ceiling)", "-", "-", f"{gemm / 1e12:.1f}", "-", "1.00"),
        ("ours: pipeline engine, TP=1 PP=1", f"{1000 * seconds:.1f}", f"{samples_per_second * a.seq:,.0f}",
         f"{achieved / 1e12:.1f}", mfu, f"{achieved / gemm:.2f}"),
    ]))
    if peak is None:
        print("no MFU: the device is not in megatron/metrics/mfu.py's peak table; pass --peak-tflops")
    # memory after the first step: weights, gradients, optimizer must match to the byte; on CUDA the
    # activation column is max_memory_allocated minus those three (transient buffers included)
    [(_, _, _, _, predicted, measured)] = ours.memory
    rows = [(f, f"{getattr(predicted, f):,}", f"{measured[f]:,}",
             "exact" if getattr(predicted, f) == measured[f] else f"{measured[f] / max(getattr(predicted, f), 1):.3f}")
            for f in ("weights", "gradients", "optimizer", "activations")]
    print(common.table(["memory (bytes)", "predicted", "measured", "measured / predicted"], rows))


if __name__ == "__main__":
    main()
