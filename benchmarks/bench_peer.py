"""Tokens/s of our pretrain_gpt.py against the peer, deepspeedai/Megatron-DeepSpeed, on this machine:
the same bundled corpus, model, batch and flags (4 layers, hidden 128, 4 heads, seq 256, micro batch 2,
global batch 8, fp32, ZeRO 0, dropout 0), the DeepSpeed pipeline engine with its type:transformer
split in both, CPU ranks (DS_ACCELERATOR=cpu, gloo) with one thread each, every run launched with
`deepspeed --num_gpus TP*PP`.

A run's figure is the median "elapsed time per iteration (ms)" of its own log lines for iterations
3..--iters (the first two pay for allocator and thread-pool warm-up). Runs are interleaved: each
round runs every layout on both sides, the side that goes first alternating between rounds, so
a drift in machine load hits both. Every layout has DP = 1, so both process the same tokens per
iteration and "ours tokens/s vs peer" = peer ms / ours ms (the median of the per-round ratios).

The peer, patched only to import and run on CPU (benchmarks/peer_cpu.patch, whose header says why):
    git clone https://github.com/deepspeedai/Megatron-DeepSpeed /work/peer
    cd /work/peer && git checkout 4efb479d && git apply <this repo>/benchmarks/peer_cpu.patch
    pip install pybind11  # the peer compiles its dataset helpers (megatron/data/helpers.cpp) at start-up
Its first launch also JIT-builds DeepSpeed's shm comm op (cached after); start-up is not timed.

Usage: python benchmarks/bench_peer.py --peer /work/peer [--iters 10] [--reps 3]
           [--layouts 1x1,2x1,1x2,2x2] [--compiled] [--extra-ours="--flag ..."]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import common

from tests.support.launch import free_port, logged_iterations

DATA = os.path.join(common.ROOT, "data", "corpus_text_document")
VOCAB = os.path.join(common.ROOT, "data", "gpt2-vocab.json")
MERGES = os.path.join(common.ROOT, "data", "gpt2-merges.txt")
FIRST_COUNTED = 3  # iterations 1 and 2 are warm-up
# the peer defaults to CUDA kernels and NCCL: its switches to the plain PyTorch paths our trainer
# runs (ours accepts the fusion switches too, but they are its default, so they are not passed)
PEER_CPU_FLAGS = ["--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
                  "--no-gradient-accumulation-fusion", "--use-cpu-initialization", "--distributed-backend", "gloo",
                  "--tokenizer-type", "GPT2BPETokenizer"]


def ensure_corpus() -> None:
    """The quickstart's preprocessing step (examples/pretrain_gpt_tiny_cpu.sh), only when missing:
    the .idx is written last, so its presence means the corpus is complete."""
    if not os.path.isfile(DATA + ".idx"):
        subprocess.run([sys.executable, "tools/preprocess_data.py", "--input", "data/corpus.jsonl",
                        "--output-prefix", "data/corpus", "--vocab-file", VOCAB, "--merge-file", MERGES,
                        "--append-eod", "--workers", "2"], cwd=common.ROOT, check=True)


def common_flags(a: argparse.Namespace, tp: int, pp: int, ds_config: str) -> list[str]:
    """Flags both trainers read the same way."""
    return [str(f) for f in [
        "--num-layers", 4, "--hidden-size", 128, "--num-attention-heads", 4, "--seq-length", 256,
        "--max-position-embeddings", 256, "--micro-batch-size", 2, "--global-batch-size", 8,
        "--train-iters", a.iters, "--lr", 1e-4, "--data-path", DATA, "--vocab-file", VOCAB, "--merge-file", MERGES,
        "--split", "98,2,0", "--hidden-dropout", 0, "--attention-dropout", 0, "--eval-iters", 0,
        "--eval-interval", 10 ** 6, "--log-interval", 1, "--seed", 1234,
        "--num-workers", 0,  # the peer's default is 2 loader processes per rank, ours 0: both load in the rank
        "--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp,
        "--deepspeed", "--deepspeed_config", ds_config, "--zero-stage", 0]]


def launch(root: str, flags: list[str], ranks: int, label: str, log_dir: str | None) -> float:
    """Median ms per iteration over iterations FIRST_COUNTED.. of one `deepspeed` launch from `root`."""
    # PYTHONPATH: each side imports its own `megatron` package, never the other's
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=root)
    cmd = ["deepspeed", "--num_gpus", str(ranks), "--master_port", str(free_port()), "pretrain_gpt.py", *flags]
    proc = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log_dir:  # every run's own output, to check the figures against
        with open(os.path.join(log_dir, label.replace(" ", "_") + ".log"), "a") as f:
            f.write(proc.stdout)
    times = [f["elapsed time per iteration (ms)"] for i, f in logged_iterations(proc.stdout).items()
             if i >= FIRST_COUNTED]
    if proc.returncode != 0 or not times:
        sys.exit(f"{label} failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stdout[-4000:]}")
    return common.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="checkout of the peer with benchmarks/peer_cpu.patch applied")
    parser.add_argument("--iters", type=int, default=10, help="training iterations per run (>= 3)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--layouts", default="1x1,2x1,1x2,2x2", help="comma-separated TPxPP")
    parser.add_argument("--extra-ours", default="", help="more flags for our trainer only, e.g. =--torch-compile")
    parser.add_argument("--compiled", action="store_true",
                        help="a third side: ours with --torch-compile (its iteration 2 compiles; 3.. are counted)")
    parser.add_argument("--log-dir", default=None, help="append each run's output to DIR/<side>_TPxPP.log")
    a = parser.parse_args()
    if a.iters < FIRST_COUNTED:
        parser.error(f"--iters must be at least {FIRST_COUNTED}")
    layouts = [tuple(int(n) for n in layout.split("x")) for layout in a.layouts.split(",")]
    peer = os.path.abspath(a.peer)
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    ensure_corpus()

    with tempfile.TemporaryDirectory(prefix="bench_peer_") as tmp:
        ds_config = os.path.join(tmp, "ds_config.json")  # one config for both: batch, clipping, ZeRO 0
        with open(ds_config, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": 2, "train_batch_size": 8, "gradient_clipping": 1.0,
                       "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9,
                       "wall_clock_breakdown": False}, f)
        # the peer's index maps go to a scratch directory, not next to our corpus
        peer_extra = [*PEER_CPU_FLAGS, "--data-cache-path", os.path.join(tmp, "peer-index-cache")]
        sides = {"peer": (peer, peer_extra), "ours": (common.ROOT, shlex.split(a.extra_ours))}
        if a.compiled:
            sides["ours compiled"] = (common.ROOT, shlex.split(a.extra_ours) + ["--torch-compile"])
        round_number = 0

        def measure_round():
            nonlocal round_number
            names = list(sides)
            shift = round_number % len(names)
            order = names[shift:] + names[:shift]  # no side always first
            round_number += 1
            results = {}
            for tp, pp in layouts:
                for side in order:
                    root, extra = sides[side]
                    flags = common_flags(a, tp, pp, ds_config) + extra
                    results[(tp, pp, side)] = launch(root, flags, tp * pp, f"{side} TP{tp}xPP{pp}", a.log_dir)
            return results

        # the machine is shared: every round is kept (retries=0) and the other processes' load reported
        max_ranks = max(tp * pp for tp, pp in layouts)
        rounds = common.Rounds(max_load=common.spare_cores(max_ranks), retries=0, quiet_timeout=5)
        results = rounds.run(a.reps, measure_round)

    rows = []
    ours_sides = [name for name in sides if name != "peer"]
    for tp, pp in layouts:
        peer_ms = results[(tp, pp, "peer")]
        row = [f"TP{tp}xPP{pp}", f"{common.median(peer_ms):.1f}"]
        for name in ours_sides:
            ours_ms = results[(tp, pp, name)]
            ratio = common.median([p / o for p, o in zip(peer_ms, ours_ms, strict=True)])
            row += [f"{common.median(ours_ms):.1f}", f"{ratio:.2f}x"]
        rows.append(tuple(row))
    print(f"L4 h128 a4 s256 mb2 gbs8 on the bundled corpus, fp32, ZeRO 0, gloo, 1 thread per rank; "
          f"median of iterations {FIRST_COUNTED}..{a.iters} per run, median of {a.reps} interleaved round(s)"
          + (f"; ours with {a.extra_ours}" if a.extra_ours else ""))
    header = ["layout", "peer ms/iter"]
    for name in ours_sides:
        header += [f"{name} ms/iter", f"{name} tokens/s vs peer"]
    print(common.table(header, rows))
    print(rounds.note())


if __name__ == "__main__":
    main()
