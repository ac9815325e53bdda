"""Framework overhead: our trainer vs a plain PyTorch loop on the same GPT (same shapes, fp32,
dropout 0, same FLOPs), in one process, same torch thread count, interleaved rounds.

Our side is built in-process exactly as megatron.training.pretrain builds it and timed around
the training loop's per-iteration work (the DeepSpeed engine step + the LR schedule step).
Timing in-process rather than parsing "elapsed time per iteration" from a launched run lets
both loops alternate round by round in the same process and thread pool, so machine noise
lands on both alike, and nothing outside the step (launcher, startup, logging) is counted.

Usage: python benchmarks/bench_overhead.py [--reps 5] [--iters 2] [--threads 1] [model flags]
"""
import argparse

import common
import torch


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


if __name__ == "__main__":
    main()
