"""Throughput of (TP, PP) layouts on the bundled corpus: real DeepSpeed launches of pretrain_gpt.py
on CPU ranks (gloo), same model, data and global batch, read from the trainer's own per-iteration
log line ("samples per second: X | TFLOPs: Y", TFLOPs per rank from the FLOPs formula), plus each
pipeline stage's busy and waiting time (benchmarks/pretrain_stage_timed.py).

Each layout gets the whole machine: OMP_NUM_THREADS = --cores / ranks. The first --skip
iterations of each run (allocator and thread-pool warm-up) are dropped; a run's figure is the
median of the rest. With --reps > 1 the layouts are launched round-robin (interleaved, so a load
change hits every layout alike) and the median over rounds is shown; "vs TP=1 PP=1" is the
median of each round's ratio to that round's TP=1 PP=1 run.

--before adds, for each parallel layout, a run with the earlier defaults: DeepSpeed's
type:transformer split and the TP all-reduces through gloo (--no-shm-tp-all-reduce).

With --cores 1 every rank of every layout runs one thread.
Otherwise a reference row runs TP=1 PP=1 with one thread: its ratio to the whole-machine TP=1 PP=1
run is how well one rank uses the other cores by itself (intra-op threads), which bounds what a
layout with one thread per rank can gain: "bound" = ranks x (one-thread rate / TP=1 PP=1 rate) x
m / (m + PP - 1), with m micro-batches per iteration; the last factor is the idle time DeepSpeed's
1F1B schedule gives each stage (one micro-batch of the other stages); with more ranks than cores,
cores x (one-thread rate / TP=1 PP=1 rate). The bound assumes free communication and perfectly
balanced stages.

Usage: python benchmarks/bench_layouts.py [--iters 10] [--reps 3] [--before] [model flags]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import common

from tests.support.launch import logged_iterations, run_deepspeed

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
BEFORE = ["--pp-partition-method", "type:transformer", "--no-shm-tp-all-reduce"]
ONE_THREAD = "one thread"  # the reference run's tag
FLOPS_LINE = re.compile(r"FLOPs per sample \(model, fwd\+bwd\): ([0-9,]+)")  # the startup report
STAGE_TIME = re.compile(r"STAGE_TIME stage=(\d+) tp=(\d+) iteration=(\d+) busy=([0-9.]+) waiting=([0-9.]+)")
SPLIT_ROW = re.compile(r"^\s+(\d+) \| (.+?)\s+\| ([0-9.]+%)$", re.M)  # the startup report's split table


def corpus(workdir: str | None = None) -> str:
    """The bundled corpus, preprocessed as the quickstart does (once per benchmark run)."""
    out = tempfile.mkdtemp(prefix="bench_layouts_", dir=workdir)
    subprocess.run([sys.executable, "tools/preprocess_data.py", "--input", "data/corpus.jsonl",
                    "--output-prefix", os.path.join(out, "corpus"), "--vocab-file", "data/gpt2-vocab.json",
                    "--merge-file", "data/gpt2-merges.txt", "--append-eod", "--workers", "1"],
                   cwd=common.ROOT, check=True, capture_output=True)
    return os.path.join(out, "corpus_text_document")


def flags_for(a: argparse.Namespace, tp: int, pp: int, data: str, extra: Sequence[str]) -> list[str]:
    return [str(f) for f in [
        "--num-layers", a.layers, "--hidden-size", a.hidden, "--num-attention-heads", a.heads,
        "--seq-length", a.seq, "--max-position-embeddings", a.seq, "--micro-batch-size", a.micro_batch,
        "--global-batch-size", a.global_batch, "--train-iters", a.iters, "--lr", 1e-4, "--lr-warmup-iters", 1,
        "--data-path", data, "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
        "--split", "98,2,0", "--hidden-dropout", 0, "--attention-dropout", 0, "--eval-iters", 0,
        "--eval-interval", 10 ** 6, "--log-interval", 1, "--seed", 1234,
        "--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp, *extra]]


def threads_per_rank(a: argparse.Namespace, tp: int, pp: int, tag: str) -> int:
    return 1 if tag == ONE_THREAD else max(1, a.cores // (tp * pp))


def launch(tp: int, pp: int, extra: Sequence[str], a: argparse.Namespace, data: str,
           threads: int) -> tuple[float, float, dict[int, tuple[float, float]], str]:
    ranks = tp * pp
    proc = run_deepspeed(ranks, "benchmarks/pretrain_stage_timed.py", flags_for(a, tp, pp, data, extra),
                         threads_per_rank=threads)
    kept = [(f["samples per second"], f["TFLOPs"]) for i, f in logged_iterations(proc.stdout).items() if i > a.skip]
    flops = FLOPS_LINE.search(proc.stdout)
    if proc.returncode != 0 or not kept or not flops:
        sys.exit(f"TP={tp} PP={pp} {extra} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    samples_per_second = common.median([s for s, _ in kept])
    gflops_per_rank = int(flops.group(1).replace(",", "")) * samples_per_second / ranks / 1e9
    return samples_per_second, gflops_per_rank, _stage_shares(proc.stdout, a.skip), _split(proc.stdout)


def _stage_shares(output: str, skip: int) -> dict[int, tuple[float, float]]:
    """{stage: (busy s, waiting s) per iteration} on TP rank 0, over the iterations after `skip`."""
    at: dict[tuple[int, int], tuple[float, float]] = {}
    for m in STAGE_TIME.finditer(output):
        stage, tp, iteration = map(int, m.group(1, 2, 3))
        if tp == 0:
            at[(stage, iteration)] = (float(m.group(4)), float(m.group(5)))
    shares = {}
    for stage in sorted({s for s, _ in at}):
        last = max(i for s, i in at if s == stage)
        if last <= skip:
            continue
        (b1, w1), (b0, w0) = at[(stage, last)], at[(stage, skip)]
        shares[stage] = ((b1 - b0) / (last - skip), (w1 - w0) / (last - skip))
    return shares


def _split(output: str) -> str:
    return "; ".join(f"{holds}" for _, holds, _ in SPLIT_ROW.findall(output)) or "-"


def layout_bound(ranks: int, pp: int, micro_batches: int, one_thread: float) -> float:
    """The most a layout of one-thread ranks can reach relative to TP=1 PP=1 (see the docstring)."""
    cores = os.cpu_count() or 1
    if ranks > cores:  # the ranks share the cores; one rank's pipeline bubble is another's time
        return cores * one_thread
    return ranks * one_thread * micro_batches / (micro_batches + pp - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser, layers=4, hidden=128, heads=4, seq=256, micro_batch=2, vocab=8192)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--iters", type=int, default=10, help="training iterations per run")
    parser.add_argument("--skip", type=int, default=3, help="leading iterations not counted")
    parser.add_argument("--reps", type=int, default=3, help="round-robin rounds of all layouts")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="split among each layout's ranks")
    parser.add_argument("--before", action="store_true", help="also the earlier defaults (see the docstring)")
    parser.add_argument("--workdir", default=None, help="where the preprocessed corpus goes (default: $TMPDIR)")
    a = parser.parse_args()
    data = corpus(a.workdir)
    # the one-thread reference, unless TP=1 PP=1 itself runs on one thread (--cores 1)
    runs = [(1, 1, ONE_THREAD)] * (a.cores > 1) + [(tp, pp, "") for tp, pp in LAYOUTS]
    if a.before:
        runs += [(tp, pp, "before") for tp, pp in LAYOUTS if (tp, pp) != (1, 1)]

    def measure_round():
        return {(tp, pp, tag): launch(tp, pp, BEFORE if tag == "before" else [], a, data,
                                      threads_per_rank(a, tp, pp, tag)) for tp, pp, tag in runs}

    # the machine is shared: every round is kept (retries=0) and the foreign load is reported
    rounds = common.Rounds(max_load=common.spare_cores(a.cores), retries=0, quiet_timeout=5)
    results = rounds.run(a.reps, measure_round)
    base = results[(1, 1, "")]
    # how much faster one rank runs on all cores than on one: the bound of one-thread-per-rank layouts
    one_thread = common.median([r[0] / b[0] for r, b in zip(results.get((1, 1, ONE_THREAD), base), base,
                                                             strict=True)])
    micro_batches = a.global_batch // a.micro_batch  # DP = 1 in every layout here
    rows = []
    for (tp, pp, tag), per_round in results.items():
        samples = common.median([r[0] for r in per_round])
        ratio = common.median([r[0] / b[0] for r, b in zip(per_round, base, strict=True)])
        threads = threads_per_rank(a, tp, pp, tag)
        bound = (f"{layout_bound(tp * pp, pp, micro_batches, one_thread):.2f}"
                 if threads == 1 and tag != ONE_THREAD else "-")
        stages = per_round[0][2]
        busy_wait = ", ".join(
            f"{s}: {1e3 * common.median([r[2][s][0] for r in per_round]):.0f} / "
            f"{1e3 * common.median([r[2][s][1] for r in per_round]):.0f}" for s in sorted(stages)) if pp > 1 else "-"
        label = f"TP={tp} PP={pp}" + {"": "", "before": " (before: type:transformer, gloo TP)",
                                        ONE_THREAD: " (reference: one thread)"}[tag]
        rows.append((label, tp * pp, threads, f"{samples * a.seq:,.0f}", f"{ratio:.2f}", bound,
                     f"{common.median([r[1] for r in per_round]):.1f}", per_round[0][3] if pp > 1 else "-",
                     busy_wait))
    print(f"model {common.model_label(a)} on the bundled corpus, fp32, gloo, global batch {a.global_batch}, "
          f"{a.iters} iterations per run (first {a.skip} dropped), median of {a.reps} interleaved round(s)")
    print(common.table(["layout", "ranks", "threads / rank", "tokens / s", "vs TP=1 PP=1", "bound", "GFLOP/s / rank",
                        "stages (split)", "per stage: busy / waiting ms per iteration"], rows))
    print(f"bound: ranks x one-thread rate x m / (m + PP - 1), m = {micro_batches} micro-batches (more ranks than "
          f"the {os.cpu_count()} cores: cores x one-thread rate; see the docstring)"
          + (f"; one rank ran {1 / one_thread:.2f}x as fast on {a.cores} threads as on one" if a.cores > 1 else ""))
    print(rounds.note())


if __name__ == "__main__":
    main()
