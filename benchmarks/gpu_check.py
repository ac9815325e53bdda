"""The first GPU run's checklist, in one process and one table (about 3-6 minutes on one H100):
what has only ever run on CPU.

  * bf16 and fp16 training of the seed's 52M GPT (8 layers, hidden 512, 8 heads, seq 1024, GPT-2
    vocab), each eagerly and with --torch-compile: finite losses, the compiled run's losses against
    the eager run's (same seed, same batches), ms per step, TFLOPs per GPU and MFU against the
    device's datasheet peak (megatron/metrics/mfu.py);
  * memory: weights, gradients and optimizer state predicted (megatron/metrics/memory.py) equal to
    what the first step measured, to the byte; activations as a ratio (on CUDA the measurement is
    max_memory_allocated, transient buffers included);
  * the exact parameter count against a plain sum over the model's parameters (TP 1 x PP 1 holds
    each once), and FLOPs per sample against torch's FlopCounterMode over one training step
    (--attention-impl math: attention as countable matmuls);
  * apex: importable or not (the trainer runs without it).

fp16 runs with a static --loss-scale: dynamic scaling skips the first steps, and the optimizer
state the memory check measures does not exist yet after a skipped step.
`--cpu` runs the same checks on a tiny model on CPU in bf16 (fp16 needs CUDA): a dry run of
this script. Exit status 1 when a check fails.

Usage: python benchmarks/gpu_check.py [--steps 10] [--cpu]
"""
import argparse
import math
import os
import sys
import time

import torch

CPU = "--cpu" in sys.argv
if not CPU and not torch.cuda.is_available():
    sys.exit("gpu_check.py: no CUDA device visible to torch; run it on a GPU machine (or --cpu for a dry run)")
os.environ.setdefault("DS_ACCELERATOR", "cpu" if CPU else "cuda")

import common  # noqa: E402


def synchronize():
    if not CPU:
        torch.cuda.synchronize()


def train(model, precision, compiled, steps, warmup):
    """(trainer, [losses], seconds per step after the warm-up)."""
    extra = [f"--{precision}"] + (["--loss-scale", "4096"] if precision == "fp16" else [])
    extra += ["--torch-compile"] if compiled else []
    trainer = common.Trainer(common.trainer_flags(*model, extra=extra))
    losses = [float(trainer.step()) for _ in range(warmup)]  # eager measured step, then the compile
    synchronize()
    start = time.perf_counter()
    losses += [float(trainer.step()) for _ in range(steps)]
    synchronize()
    return trainer, losses, (time.perf_counter() - start) / steps


def flop_counter_check(model):
    """FlopCounterMode's FLOPs of one training step against the trainer's FLOPs per sample."""
    from torch.utils.flop_counter import FlopCounterMode
    trainer = common.Trainer(common.trainer_flags(*model, extra=["--bf16", "--attention-impl", "math"]))
    trainer.step()  # the memory check's step, outside the count
    with FlopCounterMode(display=False) as counter:
        trainer.step()
    counted = counter.get_total_flops()
    expected = trainer.args.flops_per_sample * trainer.samples_per_step
    owned = sum(p.numel() for p in trainer.engine.module.parameters())
    return (("FLOPs per step: FlopCounterMode vs flops_per_sample x batch", counted == expected,
             f"{counted:,} vs {expected:,}"),
            ("parameter count vs a plain sum over the parameters", owned == trainer.args.parameters,
             f"{trainer.args.parameters:,} vs {owned:,}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="a dry run on a tiny model on CPU, bf16 only")
    a = parser.parse_args()
    model = (2, 64, 4, 64, 2, 512) if CPU else (8, 512, 8, 1024, 16, 50257)  # layers hidden heads seq mb vocab
    device = "CPU (dry run)" if CPU else torch.cuda.get_device_name()
    rows, failed = [], []

    def check(name, ok, detail):
        rows.append((name, "ok" if ok else "FAIL", detail))
        if not ok:
            failed.append(name)

    try:
        import apex  # noqa: F401
        rows.append(("apex", "-", "importable"))
    except ImportError:
        rows.append(("apex", "-", "not installed (not needed)"))
    for precision in ("bf16",) if CPU else ("bf16", "fp16"):
        eager_losses = None
        for compiled in (False, True):
            label = f"{precision}{', --torch-compile' if compiled else ''}"
            trainer, losses, seconds = train(model, precision, compiled, a.steps, a.warmup)
            check(f"{label}: losses finite", all(math.isfinite(x) for x in losses),
                  f"first {losses[0]:.4f}, last {losses[-1]:.4f}")
            if compiled:
                worst = max(abs(c - e) / abs(e) for c, e in zip(losses, eager_losses, strict=True))
                check(f"{label}: losses vs eager (same seed)", worst < 2e-2, f"largest relative difference {worst:.2e}")
            else:
                eager_losses = losses
            samples = trainer.samples_per_step / seconds
            peak = trainer.args.run_config.logging.mfu.peak_tflops_per_device
            mfu = "no peak for this device" if peak is None else \
                f"MFU {100 * trainer.args.model_flops_per_sample * samples / (peak * 1e12):.1f}%"
            rows.append((f"{label}: speed", "-", f"{1000 * seconds:.1f} ms/step, "
                         f"{trainer.flops_per_sample * samples / 1e12:.1f} TFLOPs, {mfu}"))
            [(_, _, _, _, predicted, measured)] = trainer.memory
            exact = [f for f in ("weights", "gradients", "optimizer") if getattr(predicted, f) == measured[f]]
            check(f"{label}: memory predicted == measured", len(exact) == 3,
                  f"exact: {', '.join(exact) or 'none'}; activations measured / predicted "
                  f"{measured['activations'] / max(predicted.activations, 1):.2f}")
    for name, ok, detail in flop_counter_check(model):
        check(name, ok, detail)
    print(f"{device}: model {model}, torch {torch.__version__}, {a.steps} timed steps after {a.warmup}")
    print(common.table(["check", "result", "detail"], rows))
    if failed:
        sys.exit(f"gpu_check.py: {len(failed)} check(s) failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
