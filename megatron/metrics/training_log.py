"""The per-iteration log line and TensorBoard scalars (Megatron-DeepSpeed tag names).

Everything here reads the run's LoggingConfig, the numbers cached on `args` when the model was
built (`cache`: args.parameters*, args.flops_per_sample, args.model_flops_per_sample) and plain
values the training loop hands over: no collective, no walk over the model's parameters, no
engine. `writer`: the SummaryWriter the MetricsProcessor owns, or a NoWriter."""
import math
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from megatron import print_rank_last
from megatron.metrics.config import LoggingConfig
from megatron.metrics.mfu import interval_mfu
from megatron.metrics.rank_timing import timing_lines, write_timing
from megatron.schedules.progress import TrainingProgress


class NoWriter:
    """Stands in for the SummaryWriter on ranks (or runs) that write no TensorBoard."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_text(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def write_group(writer: Any, tag: str, value: float, progress: TrainingProgress,
                axes: tuple[str, ...] = ("iteration", "samples", "tokens", "gigaflos")) -> None:
    """Megatron-DeepSpeed's tag group: `tag` against iterations, and `tag vs samples`,
    `tag vs tokens`, `tag vs gigaflos (without embeddings)` for the scaling-law x axes."""
    x = {"iteration": ("", progress.iteration),
         "samples": (" vs samples", progress.consumed_train_samples),
         "tokens": (" vs tokens", progress.consumed_train_tokens),
         "gigaflos": (" vs gigaflos (without embeddings)", progress.gigaflos_no_embeds)}
    for axis in axes:
        suffix, step = x[axis]
        writer.add_scalar(tag + suffix, value, step)


def log_model_size(writer: Any, cache: Namespace, is_moe: bool, report_lines: list[str]) -> None:
    """Once, at step 0, for the arch-and-scaling dashboards. TensorBoard stores scalars as float32,
    exact only below 2^24 (16.7M): the scalars are for plotting, and the exact integers (the
    startup report's table) go next to them as a text summary."""
    writer.add_scalar("model/parameters", cache.parameters, 0)
    writer.add_scalar("model/parameters without embeddings", cache.parameters_no_embedding, 0)
    if is_moe:  # the parameters a token passes through (top-k experts)
        writer.add_scalar("model/parameters active", cache.parameters_active, 0)
        writer.add_scalar("model/parameters active without embeddings", cache.parameters_active_no_embedding, 0)
    # indented: TensorBoard renders text as markdown, and a code block keeps the table's columns
    writer.add_text("model/parameters (exact)", "\n".join("    " + line for line in report_lines), 0)
    # which FLOPs convention every FLOPs scalar uses (the report's line, megatron/model/analytic.py)
    for line in report_lines:
        if line.startswith("FLOPs convention: "):
            writer.add_text("model/FLOPs convention", line, 0)


@dataclass
class IntervalStats:
    """What the iterations since the last log line add up to. The loss averages the iterations
    whose update was applied (an fp16 overflow step's loss is not a loss of the model)."""
    iterations: int = 0
    samples: int = 0
    applied: int = 0
    loss: float | torch.Tensor = 0.0  # a tensor sum once a loss was added: no host sync until we log
    moe_loss: torch.Tensor | None = None  # MoE models: the load-balancing loss, summed like `loss`
    # samples per sequence length trained (a curriculum changes it between iterations); empty: all
    # at --seq-length
    samples_at: dict[int, int] = field(default_factory=dict)

    def add(self, loss: torch.Tensor, samples: int, applied: bool, moe_loss: torch.Tensor | None = None,
            seqlen: int | None = None) -> None:
        self.iterations += 1
        self.samples += samples
        if seqlen is not None:
            self.samples_at[seqlen] = self.samples_at.get(seqlen, 0) + samples
        if applied:
            self.applied += 1
            self.loss = self.loss + loss
            if moe_loss is not None:
                self.moe_loss = moe_loss if self.moe_loss is None else self.moe_loss + moe_loss

    @property
    def skipped(self) -> int:
        return self.iterations - self.applied

    def mean_loss(self) -> float:
        return float(self.loss) / max(1, self.applied)

    def mean_moe_loss(self) -> float | None:
        return None if self.moe_loss is None else float(self.moe_loss) / max(1, self.applied)


def interval_work(stats: IntervalStats, cache: Namespace, seq_length: int) -> tuple[int, float, float]:
    """(tokens, FLOPs, model FLOPs) of the interval's samples, each at the length it was trained
    at: the FLOPs per sample of each length are the ones cached at model build."""
    if not stats.samples_at:  # every sample at --seq-length
        return (stats.samples * seq_length, stats.samples * cache.flops_per_sample,
                stats.samples * cache.model_flops_per_sample)
    at = stats.samples_at.items()
    return (sum(n * s for s, n in at), sum(n * cache.flops_per_sample_at[s] for s, n in at),
            sum(n * cache.model_flops_per_sample_at[s] for s, n in at))


def throughput(samples: int, tokens: int, flops: float, elapsed: float,
               world_size: int) -> tuple[float, float, float]:
    """(samples/s, tokens/s, TFLOPs per GPU) over a logging interval of `samples` samples holding
    `tokens` tokens and `flops` FLOPs."""
    return samples / elapsed, tokens / elapsed, flops / (elapsed * world_size * 1e12)


def training_log(writer: Any, config: LoggingConfig, cache: Namespace, stats: IntervalStats, elapsed: float,
                 progress: TrainingProgress, *, lr: float, grad_norm: float | torch.Tensor | None,
                 loss_scale: float | None, global_batch_size: int, total_iterations: int,
                 params_norm: float | None = None, num_zeros: int | None = None,
                 curriculum_seqlen: int | None = None, memory_stats: Mapping[str, int] | None = None,
                 rank_times: list[float] | None = None) -> None:
    """The line over `stats`' iterations, `elapsed` seconds of training steps; total_iterations:
    the run's length (the Trainer's); params_norm / num_zeros: --log-params-norm /
    --log-num-zeros-in-grad (the fork's tags and fields); curriculum_seqlen: the length the last
    iteration trained at, with a curriculum (Microsoft's fork's field and tags); memory_stats:
    torch.cuda.memory_stats() with --log-memory-to-tensorboard."""
    loss = stats.mean_loss()
    grad_norm = None if grad_norm is None else float(grad_norm)
    tokens, flops, model_flops = interval_work(stats, cache, config.seq_length)
    samples_per_second, tokens_per_second, tflops = throughput(stats.samples, tokens, flops, elapsed,
                                                               config.world_size)
    mfu = interval_mfu(model_flops / max(1, stats.samples), stats.samples, elapsed, config.world_size,
                       config.mfu.peak_tflops_per_device)  # None without a known peak
    dp, it = config.data_parallel_size, progress.iteration

    write_group(writer, "learning-rate/learning-rate", lr, progress, axes=("iteration", "samples", "tokens"))
    if config.log_batch_size_to_tensorboard:
        write_group(writer, "batch-size/batch-size", global_batch_size, progress, axes=("iteration", "samples"))
    write_group(writer, "lm-loss-training/lm loss", loss, progress)
    moe_loss = stats.mean_moe_loss()
    if moe_loss is not None:
        write_group(writer, "lm-loss-training/moe loss", moe_loss, progress)
    if loss_scale is not None and config.log_loss_scale_to_tensorboard:
        write_group(writer, "loss-scale/loss-scale", loss_scale, progress, axes=("iteration", "samples", "tokens"))
    if config.log_world_size_to_tensorboard:
        write_group(writer, "world-size/world-size", config.world_size, progress,
                    axes=("iteration", "samples", "tokens"))
    if memory_stats is not None:  # the fork's three tags, at the top level
        for tag, key in (("mem-reserved-bytes", "reserved_bytes.all.current"),
                         ("mem-allocated-bytes", "allocated_bytes.all.current"),
                         ("mem-allocated-count", "allocation.all.current")):
            writer.add_scalar(tag, memory_stats[key], it)
    if grad_norm is not None:
        writer.add_scalar("grad-norm/grad-norm", grad_norm, it)
    if num_zeros is not None:
        write_group(writer, "num-zeros/num-zeros", num_zeros, progress, axes=("iteration", "samples", "tokens"))
    if params_norm is not None:
        write_group(writer, "params-norm/params-norm", params_norm, progress, axes=("iteration", "samples", "tokens"))
    if curriculum_seqlen is not None:
        write_group(writer, "seqlen/curriculum_seqlen", curriculum_seqlen, progress,
                    axes=("iteration", "samples", "tokens"))
    if config.log_timers_to_tensorboard:
        writer.add_scalar("iteration-time/iteration-time", elapsed / stats.iterations, it)
    writer.add_scalar("iteration-time/samples per second", samples_per_second, it)
    writer.add_scalar("iteration-time/samples per second per replica", samples_per_second / dp, it)
    writer.add_scalar("iteration-time/tokens per second", tokens_per_second, it)
    writer.add_scalar("iteration-time/tokens per second per replica", tokens_per_second / dp, it)
    writer.add_scalar("iteration-time/TFLOPs per gpu (estimated)", tflops, it)
    if mfu is not None:
        writer.add_scalar("iteration-time/MFU", mfu, it)

    line = (f" iteration {it:8d}/{total_iterations:8d} |"
            f" consumed samples: {progress.consumed_train_samples:12d} |"
            f" consumed tokens: {progress.consumed_train_tokens:12d} |"
            f" elapsed time per iteration (ms): {1000.0 * elapsed / stats.iterations:.1f} |"
            f" learning rate: {lr:.3E} |"
            f" global batch size: {global_batch_size:5d} |"
            f" lm loss: {loss:.6E} |")
    if moe_loss is not None:
        line += f" moe loss: {moe_loss:.6E} |"
    if loss_scale is not None:
        line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    if num_zeros is not None:
        line += f" num zeros: {num_zeros:.1f} |"
    if params_norm is not None:
        line += f" params norm: {params_norm:.3f} |"
    if curriculum_seqlen is not None:
        line += f" curriculum seqlen: {curriculum_seqlen:5d} |"
    line += f" number of skipped iterations: {stats.skipped:3d} |"
    line += f" samples per second: {samples_per_second:.3f} | TFLOPs: {tflops:.2f} |"
    if mfu is not None:
        line += f" MFU: {100 * mfu:.2f}% |"
    print_rank_last(line)
    if rank_times is not None and config.timing_log_option is not None:
        print_rank_last(timing_lines(config.timing_log_option, rank_times))
        write_timing(writer, config.timing_log_option, rank_times, it)


def evaluation_log(writer: Any, config: LoggingConfig, prefix: str, loss: float, progress: TrainingProgress,
                   tensorboard: bool = True, name: str | None = None) -> None:
    """One evaluation's line and scalars; `name`: a --valid-weighted-split-paths group, whose line
    and tags carry it as BigScience's fork names them (`NAME loss at ...`,
    `lm-loss-validation/NAME/lm loss validation`)."""
    ppl = math.exp(min(20.0, loss))
    if tensorboard:
        group = "lm-loss-validation" if name is None else f"lm-loss-validation/{name}"
        write_group(writer, f"{group}/lm loss validation", loss, progress)
        if config.log_validation_ppl_to_tensorboard:
            write_group(writer, f"{group}/lm loss validation ppl", ppl, progress)
    bar = "-" * 100
    what = "validation loss" if name is None else f"{name} loss"
    print_rank_last(f"{bar}\n {what} at {prefix} | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} |"
                    f"\n{bar}")
