"""DeepSpeed-Ulysses (--ds-sequence-parallel-size) on this machine: tokens/s and memory per rank
versus sequence length at SP 1, 2, 4, from real `deepspeed` launches of pretrain_gpt.py
(--no-pipeline-parallel, mock data, one replica: DP = 1, so the SP ranks are the whole job).

Per run: tokens/s of the replica (the log line's samples per second x seq, median over the
iterations after --skip), and rank 0's memory after the first iteration as the trainer prints it
(predicted / measured: weights + gradients + optimizer state exact; activations the estimate /
the bytes autograd saved for backward). "vs SP=1" is the ratio to the same sequence length's SP=1
run (with --reps, the median over interleaved rounds of each round's ratio). Every launch gets
the whole machine: OMP_NUM_THREADS = max(1, --cores / SP).

Usage: python benchmarks/bench_ulysses.py [--seqs 256 512 1024 2048] [--sps 1 2 4] [model flags]
"""
import argparse
import re
import sys

import common

from tests.support.launch import logged_iterations, run_deepspeed

# "   rank | stage | tp | dp | weights | gradients | optimizer | activations", each "predicted/measured"
MEMORY_ROW = re.compile(r"^\s+0 \|\s+0 \|\s+0 \|\s+0 \| (.+)$", re.M)


def launch(a: argparse.Namespace, seq: int, sp: int) -> tuple[float, list[tuple[int, int]]]:
    """(tokens/s, [(predicted, measured) bytes of weights, gradients, optimizer, activations])."""
    flags = common.trainer_flags(a.layers, a.hidden, a.heads, seq, a.micro_batch, a.vocab, train_iters=a.iters,
                                 log_interval=1, extra=["--no-pipeline-parallel", "--ds-sequence-parallel-size", sp,
                                                        "--zero-stage", a.zero_stage])
    proc = run_deepspeed(sp, "pretrain_gpt.py", flags, threads_per_rank=max(1, a.cores // sp))
    kept = [f["samples per second"] for i, f in logged_iterations(proc.stdout).items() if i > a.skip]
    row = MEMORY_ROW.search(proc.stdout)
    if proc.returncode != 0 or not kept or not row:
        sys.exit(f"seq {seq} SP={sp} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    cells = [tuple(int(x.replace(",", "")) for x in cell.split()[0].split("/")) for cell in row.group(1).split("|")]
    return common.median(kept) * seq, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser, layers=2, hidden=256, heads=8, seq=0, micro_batch=1, vocab=8192)
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--sps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--skip", type=int, default=2, help="warm-up iterations left out of the median")
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--reps", type=int, default=1,
                        help="rounds; each runs every (seq, SP) once, interleaved; medians over rounds")
    a = parser.parse_args()
    runs: dict[tuple[int, int], list] = {}
    for _ in range(a.reps):
        for seq in a.seqs:
            for sp in a.sps:
                runs.setdefault((seq, sp), []).append(launch(a, seq, sp))
    rows = []
    for seq in a.seqs:
        for sp in a.sps:
            tokens = common.median([t for t, _ in runs[(seq, sp)]])
            # the ratio per round, to that round's SP=1 run of the same length (interleaved)
            ratio = (common.median([t / b for (t, _), (b, _) in zip(runs[(seq, sp)], runs[(seq, 1)], strict=True)])
                     if (seq, 1) in runs else None)
            cells = runs[(seq, sp)][0][1]
            state = [sum(c[k] for c in cells[:3]) for k in (0, 1)]
            (act_p, act_m) = cells[3]
            rows.append([seq, sp, f"{tokens:,.0f}", f"{ratio:.2f}" if ratio else "-",
                         f"{state[0] / 2**20:.2f} / {state[1] / 2**20:.2f}",
                         f"{act_p / 2**20:.2f} / {act_m / 2**20:.2f}"])
    print(f"model L{a.layers} h{a.hidden} a{a.heads} mb{a.micro_batch} V{a.vocab}, fp32, gloo, ZeRO {a.zero_stage}, "
          f"DP=1, {a.iters} iterations (median after {a.skip}), {a.reps} round(s)")
    print(common.table(["seq", "SP", "tokens / s", "vs SP=1", "model state MiB / rank (pred / meas)",
                        "activations MiB / rank (est / saved)"], rows))


if __name__ == "__main__":
    main()
