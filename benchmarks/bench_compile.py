"""--torch-compile and bf16 on CPU: our step with and without compiled layers, against the plain
PyTorch loop of benchmarks/common.py eager and with its blocks compiled the same way
(`Module.compile()`, inductor), and our step in bf16 (DeepSpeed's bf16 optimizer: bf16 weights and
activations, fp32 master copy) with and without the option. One process, one thread pool,
interleaved rounds (benchmarks/README.md, "How the numbers are taken").

Each runner is built and warmed up before the next is built: our first step runs eagerly (the
memory check measures it; megatron/metrics/memory_measure.py), the second compiles. "first steps"
is the time of the warm-up steps; "compile cost" is what they took beyond that many timed steps.

Usage: python benchmarks/bench_compile.py [--reps 5] [--iters 2] [--threads 1] [--no-bf16] [model flags]
"""
import argparse
import time

import common
import torch

WARMUP = 3  # eager (measured) step, compiling step, one more


def _warm(runner, steps=WARMUP):
    start = time.perf_counter()
    for _ in range(steps):
        runner.step()
    return time.perf_counter() - start


def _compiled_plain(*model):
    runner = common.PlainTrainer(*model)
    for block in runner.model.blocks:
        block.compile()
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_threads_arg(parser)
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--iters", type=int, default=2, help="steps per runner per round")
    parser.add_argument("--no-bf16", action="store_true", help="fp32 runners only")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    model = (a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab)

    def ours(*extra):
        return lambda: common.Trainer(common.trainer_flags(*model, extra=list(extra)))
    builders = {
        "plain PyTorch loop (baseline)": lambda: common.PlainTrainer(*model),
        "plain loop, blocks compiled": lambda: _compiled_plain(*model),
        "ours, fp32": ours(),
        "ours, fp32, --torch-compile": ours("--torch-compile"),
    }
    if not a.no_bf16:
        builders["ours, bf16"] = ours("--bf16")
        builders["ours, bf16, --torch-compile"] = ours("--bf16", "--torch-compile")
    runs, first = {}, {}
    for name, build in builders.items():
        runs[name] = build()
        torch.set_num_threads(a.threads)  # in case a library changed it
        first[name] = _warm(runs[name])

    rounds = common.Rounds(max_load=common.spare_cores(a.threads))
    seconds = common.time_steps(runs, a.iters, a.reps, rounds, warmup=0)
    baseline = seconds["plain PyTorch loop (baseline)"]
    tokens = a.micro_batch * a.seq
    rows = []
    for name, per_round in seconds.items():
        step = common.median(per_round)
        ratio = common.median([b / s for b, s in zip(baseline, per_round, strict=True)])
        rows.append((name, f"{1000 * step:.0f}", f"{tokens / step:,.0f}", f"{ratio:.3f}",
                     f"{first[name]:.1f}", f"{first[name] - WARMUP * step:.1f}"))
    print(f"model {common.model_label(a)}, {runs['ours, fp32'].args.parameters:,} parameters, "
          f"{a.threads} torch thread(s); median of {a.reps} interleaved rounds x {a.iters} steps")
    print(common.table(["runner", "ms / step", "tokens / s", "tokens/s vs plain", f"first {WARMUP} steps (s)",
                        "compile cost (s)"], rows))
    print(rounds.note())


if __name__ == "__main__":
    main()
