"""Where our CPU training step spends time that a plain PyTorch loop does not.

1. phases: the pipeline engine's instructions (load, forward + loss, backward, gradient reduce,
   optimizer step with our clipping hook) next to the plain loop's forward / backward / clip / AdamW;
2. torch.profiler on both: the aten ops on which ours spends more than plain, each attributed to
   the innermost function of ours (megatron/, pretrain_gpt.py) or DeepSpeed that issued it, or to
   the autograd node for backward ops;
3. the suspects timed alone against the torch equivalent, in ms per training step.

Usage: python benchmarks/profile_step.py [--steps 4] [--threads 1] [model flags]
"""
from __future__ import annotations  # the annotations name common's classes, which are not evaluated

import argparse
import collections
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import common
import torch
import torch.nn.functional as F
from deepspeed.runtime.pipe.engine import PipelineEngine
from torch.profiler import ProfilerActivity, profile

if TYPE_CHECKING:  # annotations only
    from torch.autograd.profiler_util import FunctionEvent

OURS = re.compile(r"(megatron/|pretrain_gpt\.py|deepspeed/)")
# ours multiplies without bias where plain uses addmm (and vice versa): one GEMM bucket
GEMM = {"aten::mm": "aten::mm + addmm", "aten::addmm": "aten::mm + addmm"}


class PhaseTimer:
    """Wraps the pipeline engine's instructions, and our clipping hook inside OptimizerStep, with
    timers; step() returns {phase: seconds} of one training step."""

    def __init__(self, trainer: common.Trainer) -> None:
        self.spent: collections.defaultdict[str, float]
        self.trainer, self.spent = trainer, collections.defaultdict(float)
        for instruction, fn in list(PipelineEngine._INSTRUCTION_MAP.items()):
            PipelineEngine._INSTRUCTION_MAP[instruction] = self._timed(instruction.__name__, fn)
        hooks = trainer.engine.optimizer._optimizer_step_pre_hooks
        key = next(iter(hooks))  # ours: installed before DeepSpeed saw the optimizer
        hooks[key] = self._timed("  of which: clipping", hooks[key])

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[name] += time.perf_counter() - start
        return run

    def step(self) -> dict[str, float]:
        self.spent.clear()
        start = time.perf_counter()
        self.trainer.step()
        self.spent["step total"] = time.perf_counter() - start
        return dict(self.spent)


def plain_phases(plain: common.PlainTrainer) -> dict[str, float]:
    model, optimizer = plain.model, plain.optimizer
    t0 = time.perf_counter()
    loss = model(plain.tokens, plain.labels)
    t1 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), plain.clip_grad)
    t3 = time.perf_counter()
    optimizer.step()
    t4 = time.perf_counter()
    return {"ForwardPass": t1 - t0, "BackwardPass": t2 - t1, "OptimizerStep": t4 - t2,
            "  of which: clipping": t3 - t2, "step total": t4 - t0}


def alternate(steps: int, fns: Mapping[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Call each fn once per step, in turn; {name: [result per step]}."""
    results: collections.defaultdict[str, list[Any]] = collections.defaultdict(list)
    for _ in range(steps):
        for name, fn in fns.items():
            results[name].append(fn())
    return results


def site(event: FunctionEvent) -> str:
    """Who issued this aten op: the autograd node (backward) or the innermost function of ours or
    DeepSpeed on the Python stack (forward, optimizer)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("autograd::engine::evaluate_function: "):
            return "backward of " + parent.name.split(": ", 1)[1]
        if OURS.search(parent.name):
            return re.sub(r"^.*?(megatron/|pretrain_gpt|deepspeed/)", r"\1", parent.name)
        parent = parent.cpu_parent
    return "other"


def op_profile(
    runner: common.Trainer | common.PlainTrainer,
) -> tuple[collections.Counter[str], collections.defaultdict[str, collections.Counter[str]]]:
    """One profiled step: {aten op: ms (self time)}, {aten op: {site: ms}}."""
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        runner.step()
    totals: collections.Counter[str]
    sites: collections.defaultdict[str, collections.Counter[str]]
    totals, sites = collections.Counter(), collections.defaultdict(collections.Counter)
    for event in prof.events():
        if event.name.startswith("aten::"):
            ms, op = event.self_cpu_time_total / 1000, GEMM.get(event.name, event.name)
            totals[op] += ms
            sites[op][site(event)] += ms
    return totals, sites


def mean_profile(
    profiles: Sequence[tuple[Mapping[str, float], Mapping[str, Mapping[str, float]]]],
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean over steps of op_profile results."""
    totals: collections.Counter[str]
    sites: collections.defaultdict[str, collections.Counter[str]]
    totals, sites = collections.Counter(), collections.defaultdict(collections.Counter)
    for step_totals, step_sites in profiles:
        totals.update(step_totals)
        for op, by_site in step_sites.items():
            sites[op].update(by_site)
    n = len(profiles)
    per_site = {op: {w: ms / n for w, ms in c.items()} for op, c in sites.items()}
    return {op: ms / n for op, ms in totals.items()}, per_site


def ab(current: Callable[[], object], alternative: Callable[[], object], reps: int = 9) -> tuple[float, float]:
    """Median ms of two callables, alternated."""
    current(), alternative()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, out in zip((current, alternative), times, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return 1000 * common.median(times[0]), 1000 * common.median(times[1])


def suspects(trainer: common.Trainer, a: argparse.Namespace) -> list[tuple[str, int, float, float]]:
    """Each overhead found by the profile, timed alone against what a plain loop does instead;
    (what, occurrences per step, current ms, alternative ms)."""
    from megatron import mpu
    from megatron.model.language_model import lm_loss
    from megatron.mpu import RowParallelLinear

    engine, rows = trainer.engine, []
    trainer.step()  # so that every parameter holds a .grad for the reduce and the clipping hook
    rows.append(("DeepSpeed ReduceGrads at DP=1 (flatten, scale by 1/1, all-reduce over 1 rank, copy back) "
                 "vs skipping it", 1, *ab(engine._exec_reduce_grads, lambda: None)))
    hook = next(iter(engine.optimizer._optimizer_step_pre_hooks.values()))
    params = [p for group in engine.optimizer.param_groups for p in group["params"]]
    rows.append(("our clipping hook (megatron/training/optimizer.py) vs torch.nn.utils.clip_grad_norm_", 1,
                 *ab(lambda: hook(engine.optimizer, (), {}), lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))))

    vocab = trainer.args.padded_vocab_size
    logits = torch.randn(a.seq, a.micro_batch, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (a.micro_batch, a.seq))
    mask = torch.ones(a.micro_batch, a.seq)

    def torch_loss() -> torch.Tensor:
        losses = F.cross_entropy(logits.flatten(0, 1), labels.t().flatten(), reduction="none")
        return (losses * mask.t().flatten()).sum() / mask.sum()
    rows.append(("lm_loss: vocab-parallel cross entropy fwd+bwd (megatron/mpu/cross_entropy.py) vs "
                 "F.cross_entropy", 1, *ab(lambda: lm_loss(logits, labels, mask).backward(),
                                           lambda: torch_loss().backward())))

    row = RowParallelLinear(4 * a.hidden, a.hidden, torch.nn.init.zeros_)
    x = torch.randn(a.seq, a.micro_batch, 4 * a.hidden, requires_grad=True)
    rows.append(("RowParallelLinear fwd+bwd, bias added after the GEMM vs F.linear with bias (MLP 4h->h)",
                 a.layers, *ab(lambda: row(x).sum().backward(),
                               lambda: F.linear(x, row.weight, row.bias).sum().backward())))
    tracker = mpu.get_cuda_rng_tracker()

    def fork():
        with tracker.fork():
            pass
    hundred_forks, _ = ab(lambda: [fork() for _ in range(100)], lambda: None)
    rows.append(("RNG tracker fork per attention call at dropout 0 vs none", a.layers, hundred_forks / 100, 0.0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_threads_arg(parser)
    parser.add_argument("--steps", type=int, default=4, help="steps timed / profiled per runner")
    a = parser.parse_args()

    torch.set_num_threads(a.threads)
    model = (a.layers, a.hidden, a.heads, a.seq, a.micro_batch, a.vocab)
    ours = common.Trainer(common.trainer_flags(*model))
    plain = common.PlainTrainer(*model)
    torch.set_num_threads(a.threads)
    print(f"model {common.model_label(a)}, fp32, {a.threads} torch thread(s), pipeline engine TP=1 PP=1\n")

    ours.step(), plain.step()
    timer = PhaseTimer(ours)
    phases = alternate(a.steps, {"ours": timer.step, "plain": lambda: plain_phases(plain)})
    phases = {who: {name: 1000 * common.median([p.get(name, 0.0) for p in per_step]) for name in per_step[0]}
              for who, per_step in phases.items()}
    names = ["LoadMicroBatch", "ForwardPass", "BackwardPass", "ReduceTiedGrads", "ReduceGrads", "OptimizerStep",
             "  of which: clipping", "step total"]
    print(common.table(["phase", "ours ms", "plain ms"],
                       [(n, f"{phases['ours'].get(n, 0):.1f}",
                         f"{phases['plain'][n]:.1f}" if n in phases["plain"] else "-") for n in names]))
    print("(median of steps alternating ours / plain; plain's forward includes the loss, its optimizer step "
          "is clip_grad_norm_ + AdamW; ours clips in megatron/training/optimizer.py's pre-step hook)\n")

    profiles = alternate(a.steps, {"ours": lambda: op_profile(ours), "plain": lambda: op_profile(plain)})
    (ours_ops, ours_sites), (plain_ops, _) = mean_profile(profiles["ours"]), mean_profile(profiles["plain"])
    extra = sorted(ours_ops, key=lambda op: plain_ops.get(op, 0.0) - ours_ops[op])[:10]
    rows = []
    for op in extra:
        top = sorted(ours_sites[op].items(), key=lambda kv: -kv[1])[:3]
        rows.append((op, f"{ours_ops[op]:.1f}", f"{plain_ops.get(op, 0.0):.1f}",
                     f"{ours_ops[op] - plain_ops.get(op, 0.0):+.1f}",
                     "; ".join(f"{s} {ms:.1f}" for s, ms in top)))
    print(common.table(["aten op", "ours ms/step", "plain ms/step", "difference", "issued by (ours, ms/step)"], rows))
    print("(torch.profiler self CPU time, mean of steps alternating ours / plain; Python stacks on)\n")

    step_ms = phases["ours"]["step total"]
    rows = [(what, n, f"{cur * n:.2f}", f"{alt * n:.2f}", f"{100 * (cur - alt) * n / step_ms:+.1f}%")
            for what, n, cur, alt in suspects(ours, a)]
    print(common.table(["suspect", "per step", "current ms/step", "alternative ms/step", "share of our step"], rows))


if __name__ == "__main__":
    main()
