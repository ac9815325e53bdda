"""Cost of the per-iteration logging path as the model grows.

ours:  megatron.metrics.training_log.training_log as the trainer calls it; parameter counts and FLOPs
       per sample are cached on args at build time, so it only formats numbers.
naive: the same call preceded by what Megatron-DeepSpeed did on every log: walk
       model.parameters() summing numel, then a torch.distributed all_reduce of the sum over the
       model-parallel group.

Single process, gloo, world size 1, on the real engine and LR scheduler of a trainer built at
each size; each figure is also shown as a fraction of one training iteration at that size.
The log line goes to a string buffer for both (printing it costs the same either way) and no
TensorBoard writer is configured.

Usage: python benchmarks/bench_logging.py [--sizes 4x256,4x512,4x1024,16x512] [--calls 200]
"""
import argparse
import contextlib
import gc
import io
import time
from collections.abc import Callable

import common
import torch
import torch.distributed as dist


def walk(model: torch.nn.Module) -> int:
    return sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters())


def naive_parameter_count(model: torch.nn.Module) -> int:
    from megatron import mpu
    count = torch.tensor([walk(model)])
    dist.all_reduce(count, group=mpu.get_model_parallel_group())
    return count.item()


def per_call_seconds(fn: Callable[[], object], calls: int) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls


def measure(layers: int, hidden: int,
            a: argparse.Namespace) -> tuple[str, str, int, str, str, str, str, str, str]:
    """One table row: a trainer of this size, its iteration time, and both logging paths."""
    from megatron.metrics.training_log import IntervalStats

    torch.set_num_threads(a.threads)
    trainer = common.Trainer(common.trainer_flags(layers, hidden, a.heads, a.seq, a.micro_batch, a.vocab))
    torch.set_num_threads(a.threads)
    args, engine = trainer.args, trainer.engine
    gbs = args.global_batch_size

    trainer.step()  # warm-up
    common.wait_for_quiet(common.spare_cores(a.threads), timeout=30)
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = trainer.step()
    iteration = (time.perf_counter() - start) / a.steps

    def ours() -> None:  # what the training loop does at a log step
        stats = IntervalStats()
        stats.add(loss, gbs, True)
        trainer.trainer.log(stats, iteration, gbs)

    def naive() -> None:
        naive_parameter_count(engine.module)
        ours()

    runs = {"ours": ours, "naive": naive, "walk": lambda: walk(engine.module)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(a.reps):
        for name, fn in runs.items():
            times[name].append(per_call_seconds(fn, a.calls))
    ours_s, naive_s, walk_s = (common.median(times[name]) for name in runs)
    return (f"L{layers} h{hidden}", f"{args.parameters / 1e6:.1f}M", sum(1 for _ in engine.module.parameters()),
            f"{iteration:.2f}", f"{ours_s * 1e6:.0f}", f"{naive_s * 1e6:.0f}", f"{walk_s * 1e6:.0f}",
            f"{ours_s / iteration:.1e}", f"{naive_s / iteration:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4x256,4x512,4x1024,16x512", help="LAYERSxHIDDEN, comma separated")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--calls", type=int, default=200, help="log calls per timing")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds of ours / naive / walk")
    parser.add_argument("--steps", type=int, default=2, help="training steps timed per size")
    common.add_threads_arg(parser)
    a = parser.parse_args()

    rows = []
    for size in a.sizes.split(","):
        rows.append(measure(*(int(v) for v in size.split("x")), a))
        gc.collect()  # drop this size's model and engine before building the next
    print(f"seq {a.seq}, micro batch {a.micro_batch}, vocab {a.vocab}, {a.threads} torch thread(s), "
          f"gloo world size 1; "
          f"median of {a.reps} interleaved rounds x {a.calls} calls")
    print(common.table(["model", "parameters", "parameter tensors", "iteration s", "ours us / log",
                        "naive us / log", "of which the walk, us", "ours / iteration", "naive / iteration"], rows))


if __name__ == "__main__":
    main()
