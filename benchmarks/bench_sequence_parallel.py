"""Megatron's --sequence-parallel at TP 2 on this machine: what do its per-micro-batch gradient
all-reduces cost (megatron/mpu/sequence_parallel.py sums each norm's and row-parallel bias's
gradient over TP as it arrives, one small all-reduce per tagged tensor and micro-batch, where
Megatron-LM takes one per step)? Real `deepspeed` launches of pretrain_gpt.py at TP 2 x PP 1,
with and without --sequence-parallel, at 1 and at several micro-batches per iteration: if the
hooks mattered, SP's ratio to the run without it would fall as the micro-batches (and so the
hooked all-reduces) multiply at the same tokens per micro-batch.

Per run: tokens/s (the log line's samples per second x seq, median over the iterations after
--skip). "SP / no SP" is the ratio of the two runs of a row (with --reps, the median of each
round's ratio; the rounds interleave the runs). "hooked all-reduces" per iteration: 6 tagged
tensors per layer (two LayerNorms' weight and bias, the attention's and the MLP's row-parallel
biases) and the final LayerNorm's 2, times the micro-batches.

SP's all-gathers and reduce-scatters go over gloo, while the TP all-reduces of the run without it
take this trainer's shared-memory path (megatron/mpu/shm_comm.py); --no-shm puts those on gloo too.

Usage: python benchmarks/bench_sequence_parallel.py [--micro-batches 1 8] [--reps 1] [--no-shm] [model flags]
"""
import argparse
import sys

import common

from tests.support.launch import logged_iterations, run_deepspeed


def launch(a: argparse.Namespace, micro_batches: int, sequence_parallel: bool) -> float:
    flags = common.trainer_flags(a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab,
                                 global_batch=a.micro_batch * micro_batches, train_iters=a.iters, log_interval=1,
                                 extra=["--tensor-model-parallel-size", 2]
                                 + (["--sequence-parallel"] if sequence_parallel else [])
                                 + (["--no-shm-tp-all-reduce"] if a.no_shm else []))
    proc = run_deepspeed(2, "pretrain_gpt.py", flags, threads_per_rank=max(1, a.cores // 2))
    kept = [f["samples per second"] for i, f in logged_iterations(proc.stdout).items() if i > a.skip]
    if proc.returncode != 0 or not kept:
        sys.exit(f"{micro_batches} micro-batches, SP={sequence_parallel} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout[-4000:]}")
    return common.median(kept) * a.seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser, layers=2, hidden=256, heads=8, seq=512, micro_batch=1, vocab=8192)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--skip", type=int, default=2, help="warm-up iterations left out of the median")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1, help="interleaved rounds; medians over rounds")
    parser.add_argument("--no-shm", action="store_true",
                        help="both runs' TP all-reduces over gloo too (--no-shm-tp-all-reduce), as SP's gathers are")
    a = parser.parse_args()
    runs: dict[tuple[int, bool], list[float]] = {}
    for _ in range(a.reps):
        for m in a.micro_batches:
            for sp in (False, True):
                runs.setdefault((m, sp), []).append(launch(a, m, sp))
    rows = []
    for m in a.micro_batches:
        ratio = common.median([s / b for s, b in zip(runs[(m, True)], runs[(m, False)], strict=True)])
        rows.append([m, (6 * a.layers + 2) * m, f"{common.median(runs[(m, False)]):,.0f}",
                     f"{common.median(runs[(m, True)]):,.0f}", f"{ratio:.2f}"])
    print(f"model L{a.layers} h{a.hidden} a{a.heads} s{a.seq} mb{a.micro_batch} V{a.vocab}, fp32, TP=2, TP all-reduces "
          f"{'over gloo' if a.no_shm else 'through shared memory'}, "
          f"{a.iters} iterations (median after {a.skip}), {a.reps} round(s)")
    print(common.table(["micro-batches", "hooked all-reduces / iteration", "tokens / s, no SP", "tokens / s, SP",
                        "SP / no SP"], rows))


if __name__ == "__main__":
    main()
