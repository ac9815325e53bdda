"""The startup report's comparison of the run's pipeline split with the cost-balanced one
(--pp-partition-method flops), printed when the two differ: what balancing would gain and cost.

Speed-up: a pipeline runs at the pace of its slowest stage, so the prediction is the ratio of the
slowest stage's model FLOPs per sample (forward + backward) under the two splits; bubbles and
communication are the same for both and left out. Memory: each stage's most loaded rank as the
memory table predicts it (activations estimated). In 1F1B the first stage keeps the most
micro-batches in flight, so a balanced split that moves layers onto it can need more memory there.
"""
import dataclasses

from megatron.metrics.memory import TrainingSetup, format_bytes, most_loaded, predict_memory
from megatron.model.analytic import stage_items, stage_parts
from megatron.model.partition import DEFAULT_METHOD, FLOPS_METHOD, describe_stage
from megatron.model.shape import ModelShape


def stage_flops(shape: ModelShape) -> list[int]:
    """Model FLOPs per sample (forward + backward, no recompute) of each stage under the shape's split."""
    return [sum(item.flops for item in items) for items in stage_items(shape)]


def balanced_speedup(shape: ModelShape) -> float:
    """The slowest stage's FLOPs under the shape's split over those under the flops split."""
    balanced = dataclasses.replace(shape, pp_partition_method=FLOPS_METHOD)
    return max(stage_flops(shape)) / max(stage_flops(balanced))


def split_comparison_lines(shape: ModelShape, setup: TrainingSetup) -> list[str]:
    """Nothing at PP 1, with the flops split, or when it equals the run's; else a heading with the
    predicted speed-up and a table of both splits' layers and predicted memory per stage."""
    method = shape.pp_partition_method or DEFAULT_METHOD
    if shape.pipeline_model_parallel_size == 1 or method.lower() == FLOPS_METHOD:
        return []
    balanced = dataclasses.replace(shape, pp_partition_method=FLOPS_METHOD)
    if stage_parts(balanced) == stage_parts(shape):
        return []
    memory = [[most_loaded([r for r in predict_memory(s, setup) if r.stage == stage]).total
               for stage in range(shape.pipeline_model_parallel_size)] for s in (shape, balanced)]
    holds = [[describe_stage(items, shape.num_layers) for items in stage_items(s)] for s in (shape, balanced)]
    lines = [f"--pp-partition-method {FLOPS_METHOD} would split otherwise: predicted speed-up "
             f"{balanced_speedup(shape):.2f}x (the slowest stage's FLOPs), memory per rank (predicted) "
             f"{format_bytes(max(memory[0]))} -> {format_bytes(max(memory[1]))} on the most loaded stage",
             f"  stage | {method:34s} | {'memory':>15s} | {FLOPS_METHOD:34s} | {'memory':>15s}"]
    for stage in range(shape.pipeline_model_parallel_size):
        lines.append(f"  {stage:5d} | {holds[0][stage]:34s} | {memory[0][stage]:15,} | {holds[1][stage]:34s} | "
                     f"{memory[1][stage]:15,}")
    return lines
