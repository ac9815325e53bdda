"""Hardware ceiling and model FLOP utilisation (MFU) on this CPU.

The ceiling is the measured rate of a large square fp32 matmul (torch.mm, 2 n^3 FLOPs) at the
same torch thread count as the training runs. Each run's model FLOPs/s is
megatron.model.analytic.flops_per_sample (the number the trainer's "TFLOPs" log field uses) times its
samples/s. The GEMM is re-measured in every interleaved round, so ceiling and runs see the same
machine conditions; MFU is the per-round ratio, median over rounds.

Usage: python benchmarks/bench_mfu.py [--gemm-size 2048] [--reps 5] [--threads 1] [model flags]
"""
import argparse
import time

import common
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_threads_arg(parser)
    parser.add_argument("--gemm-size", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--iters", type=int, default=1, help="steps per runner per round")
    a = parser.parse_args()

    torch.set_num_threads(a.threads)
    model = (a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab)
    ours = common.Trainer(common.trainer_flags(*model))
    runs = {"plain PyTorch loop": common.PlainTrainer(*model),
            "ours: pipeline engine, TP=1 PP=1": ours}
    torch.set_num_threads(a.threads)
    for runner in runs.values():
        runner.step()  # warm-up

    def measure_round() -> dict[str, float]:
        values = {"gemm": common.gemm_flops(a.gemm_size)}
        for name, runner in runs.items():
            start = time.perf_counter()
            for _ in range(a.iters):
                runner.step()
            values[name] = runner.samples_per_step * a.iters / (time.perf_counter() - start)  # samples/s
        return values

    rounds = common.Rounds(max_load=common.spare_cores(a.threads))
    results = rounds.run(a.reps, measure_round)
    gemm = results.pop("gemm")
    rows = [(f"fp32 GEMM {a.gemm_size}^3 (ceiling)", f"{common.median(gemm) / 1e9:.1f}", "1.00")]
    for name, samples_per_second in results.items():
        flops = [ours.flops_per_sample * s for s in samples_per_second]
        rows.append((name, f"{common.median(flops) / 1e9:.1f}",
                     f"{common.median([f / g for f, g in zip(flops, gemm, strict=True)]):.2f}"))
    print(f"model {common.model_label(a)}, fp32, {ours.flops_per_sample / 1e9:.1f} GFLOPs per sample "
          f"(megatron.model.analytic.flops_per_sample), {a.threads} torch thread(s); median of {a.reps} rounds")
    print(common.table(["run", "GFLOP/s", "fraction of GEMM rate (MFU)"], rows))
    print(rounds.note())


if __name__ == "__main__":
    main()
