"""Throughput of (TP, PP) layouts: real `deepspeed --num_gpus N pretrain_gpt.py` runs on CPU ranks
(gloo), same model and global batch, read from the trainer's own per-iteration log line
("samples per second: X | TFLOPs: Y", TFLOPs per rank from megatron.model.analytic.flops_per_sample).

Every layout gets the whole machine: OMP_NUM_THREADS = --cores / ranks. The first --skip
iterations of each run (allocator and thread-pool warm-up) are dropped; a run's figure is the
median of the rest, and with --reps > 1 the layouts are launched round-robin and the median
over rounds is shown.

Usage: python benchmarks/bench_layouts.py [--iters 6] [--reps 1] [--global-batch 8] [model flags]
"""
import argparse
import os
import re
import sys

import common
from megatron.launch import logged_iterations, run_deepspeed

LAYOUTS = [(1, 1), (2, 1), (1, 2)]
FLOPS_LINE = re.compile(r"FLOPs per sample \(model, fwd\+bwd\): ([0-9,]+)")  # the startup report


def launch(tp, pp, a):
    ranks = tp * pp
    flags = common.trainer_flags(a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab,
                                 global_batch=a.global_batch, train_iters=a.iters, log_interval=1,
                                 extra=["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp])
    proc = run_deepspeed(ranks, "pretrain_gpt.py", flags, threads_per_rank=max(1, a.cores // ranks))
    kept = [(f["samples per second"], f["TFLOPs"]) for i, f in logged_iterations(proc.stdout).items() if i > a.skip]
    flops = FLOPS_LINE.search(proc.stdout)
    if proc.returncode != 0 or not kept or not flops:
        sys.exit(f"TP={tp} PP={pp} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    samples_per_second = common.median([s for s, _ in kept])
    # the log prints TFLOPs with 2 decimals; the same formula from samples/s keeps more digits
    gflops_per_rank = int(flops.group(1).replace(",", "")) * samples_per_second / ranks / 1e9
    return samples_per_second, common.median([t for _, t in kept]), gflops_per_rank


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser, micro_batch=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--iters", type=int, default=6, help="training iterations per run")
    parser.add_argument("--skip", type=int, default=2, help="leading iterations not counted")
    parser.add_argument("--reps", type=int, default=1, help="round-robin rounds of all layouts")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="split among each layout's ranks")
    a = parser.parse_args()

    def measure_round():
        return {layout: launch(*layout, a) for layout in LAYOUTS}

    # every layout uses all cores, so any foreign load slows it
    rounds = common.Rounds(max_load=common.spare_cores(a.cores), retries=1)
    results = rounds.run(a.reps, measure_round)
    base = results[(1, 1)]
    rows = []
    for (tp, pp), per_round in results.items():
        ranks = tp * pp
        micro_batches = a.global_batch // a.micro_batch  # DP = 1 in every layout
        samples = common.median([r[0] for r in per_round])
        ratio = common.median([r[0] / b[0] for r, b in zip(per_round, base)])
        rows.append((f"TP={tp} PP={pp}", ranks, max(1, a.cores // ranks), micro_batches,
                     f"{(pp - 1) / (micro_batches + pp - 1):.2f}", f"{samples * a.seq:,.0f}", f"{ratio:.2f}",
                     f"{common.median([r[1] for r in per_round]):.2f}",
                     f"{common.median([r[2] for r in per_round]):.1f}"))
    print(f"model {common.model_label(a)}, fp32, global batch {a.global_batch}, {a.iters} iterations per run "
          f"(first {a.skip} dropped), median of {a.reps} round(s)")
    print(common.table(["layout", "ranks", "threads / rank", "micro-batches / iteration",
                        "ideal pipeline bubble", "tokens / s", "vs TP=1 PP=1", "TFLOPs / rank (log line)",
                        "GFLOP/s / rank"], rows))
    print(rounds.note())


if __name__ == "__main__":
    main()
