"""Framework overhead: our trainer vs a plain PyTorch loop on the same GPT (same shapes, fp32,
dropout 0, same FLOPs), in one process, same torch thread count, interleaved rounds.

Our side is built in-process exactly as megatron.training.pretrain builds it and timed around
the training loop's per-iteration work (the DeepSpeed engine step + the LR schedule step).
Timing in-process rather than parsing "elapsed time per iteration" from a launched run lets
both loops alternate round by round in the same process and thread pool, so machine noise
lands on both alike, and nothing outside the step (launcher, startup, logging) is counted.

It also times what the loop adds after each step: the NaN check (Trainer.check_loss, on by
default: one MAX all-reduce of two floats), in this process (world size 1) and, for the collective's
own latency between ranks, a gloo all-reduce of one float between two processes on this host.
The exit flags (Trainer.agree_on_stop) add a second such all-reduce only when --save (its stop
signals), --exit-duration-in-mins, --kill-switch-path or --exit-signal-handler is given.

Usage: python benchmarks/bench_overhead.py [--reps 5] [--iters 2] [--threads 1] [model flags]
"""
import argparse
import os
import time

import common
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _time_calls(call, n: int) -> float:
    """Median seconds per call over 5 batches of n calls."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            call()
        batches.append((time.perf_counter() - start) / n)
    return common.median(batches)


def _allreduce_rank(rank: int, port: int, n: int, result: "mp.Queue") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    flags = torch.zeros(1)
    seconds = _time_calls(lambda: dist.all_reduce(flags, op=dist.ReduceOp.MAX), n)
    if rank == 0:
        result.put(seconds)
    dist.destroy_process_group()


def two_rank_allreduce_seconds(n: int = 2000) -> float:
    """Seconds per MAX all-reduce of four floats between two gloo processes on this host."""
    from tests.support.launch import free_port
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(rank, port, n, result)) for rank in range(2)]
    for p in procs:
        p.start()
    seconds = result.get(timeout=600)
    for p in procs:
        p.join()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_threads_arg(parser)
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--iters", type=int, default=2, help="steps per runner per round")
    a = parser.parse_args()

    torch.set_num_threads(a.threads)
    model = (a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab)
    ours = common.Trainer(common.trainer_flags(*model))
    runs = {
        "plain PyTorch loop (baseline)": common.PlainTrainer(*model),
        "ours: pipeline engine (default path), TP=1 PP=1": ours,
        "ours: --no-pipeline-parallel (DeepSpeedEngine)": common.Trainer(
            common.trainer_flags(*model, extra=["--no-pipeline-parallel"])),
    }
    torch.set_num_threads(a.threads)  # after every build, in case a library changed it

    rounds = common.Rounds(max_load=common.spare_cores(a.threads))
    seconds = common.time_steps(runs, a.iters, a.reps, rounds)
    baseline = "plain PyTorch loop (baseline)"
    tokens = a.micro_batch * a.seq
    rows = []
    for name, per_round in seconds.items():
        ratio = common.median([b / s for b, s in zip(seconds[baseline], per_round, strict=True)])
        rows.append((name, f"{1000 * common.median(per_round):.0f}", f"{tokens / common.median(per_round):,.0f}",
                     f"{ratio:.3f}"))
    print(f"model {common.model_label(a)}, fp32, {ours.args.parameters:,} parameters, "
          f"{a.threads} torch thread(s); median of {a.reps} interleaved rounds x {a.iters} steps")
    print(common.table(["runner", "ms / step", "tokens / s", "tokens/s vs plain"], rows))
    print(rounds.note())

    # the NaN check after each iteration (on by default): one all-reduce of two floats
    loss, step = ours.step(), common.median(seconds["ours: pipeline engine (default path), TP=1 PP=1"])
    check = _time_calls(lambda: ours.trainer.check_loss(loss), 2000)
    between = two_rank_allreduce_seconds()
    print(f"NaN check per iteration (one all-reduce of 2 floats): "
          f"{1e6 * check:.0f} us in this process (world size 1), {100 * check / step:.3f}% of a step; "
          f"the all-reduce between 2 gloo processes on this host: {1e6 * between:.0f} us")


if __name__ == "__main__":
    main()
