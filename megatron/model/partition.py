"""The rules that split GPTModelPipe's layers into pipeline stages (torch-free, shape-free).

GPTModelPipe hands DeepSpeed's PipelineModule one list of layer specs ("items"): the embedding,
the L transformer layers, (an MoE model: the function that keeps the moe loss), the final norm and
the output layer (the tied embedding copy, or the untied OutputLayer) -- in the order
ModelShape.pipe_layers describes. megatron/model/analytic.py weighs the items (pipe_items) and
asks `split_items` for the shape's split (stage_parts). A split is P + 1 item boundaries `parts`:
stage p holds items parts[p] .. parts[p + 1] - 1, as DeepSpeed's `parts`.

--pp-partition-method:
  (default) type:transformer
                         the forks' default (BigScience when the flag is absent, Microsoft always):
                         the transformer layers spread evenly, so a launch script splits as in the
                         fork and fits the memory it fitted there.
  flops                  balanced by cost: the split whose most expensive stage has the fewest
                         forward + backward FLOPs per sample (the formula of analytic.py, item by
                         item: embedding and norm 0, each transformer layer, the logits 6shV);
                         among those, the one whose largest stage holds the fewest parameters.
  uniform / parameters / type:REGEX
                         DeepSpeed's methods, reproduced here so the count, the memory table,
                         checkpoints and tools/param_count.py know the split without building the
                         model; the built module's split is checked against this one at startup.

BLOOM's scripts pass "type:transformer|embedding". With a large vocabulary the output layer alone
costs several transformer layers, so an even layer count leaves every other stage waiting for the
last one; flops gives the last stage fewer layers. It is not the default: in 1F1B the first stage
already keeps the most micro-batches in flight, and moving layers onto it raises its activation
memory (the startup report shows, when the two differ, the predicted speed-up and both memories).
"""
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .shape import DEEPSPEED_METHODS, DEFAULT_METHOD, FLOPS_METHOD, TRANSFORMER_ITEM

__all__ = ["DEEPSPEED_METHODS", "DEFAULT_METHOD", "FLOPS_METHOD", "TRANSFORMER_ITEM", "PipeItem", "describe_stage",
           "split_items"]


class PipeItem(NamedTuple):
    name: str          # the class (function) name DeepSpeed's type:REGEX matches
    layer: int | None  # the parameter table's layer index (None: the MoE loss function, no parameters)
    params: int        # parameters one rank builds for it (TP-local, its EP rank's experts), as DeepSpeed counts
    flops: int         # model FLOPs per sample, forward + backward (no recompute: see split_items)


def split_items(items: Sequence[PipeItem], parts: int, method: str | None) -> tuple[int, ...]:
    """The parts + 1 item boundaries that `method` (see the module docstring; None: the default) gives.
    The cost-balanced split uses model FLOPs without activation recompute, so it is a property of
    the model and layout alone: a checkpoint resumes with or without --checkpoint-activations."""
    method = method or DEFAULT_METHOD
    lower = method.lower()
    if lower == FLOPS_METHOD:
        return tuple(_flops_balanced(items, parts))
    if lower == "uniform":
        return tuple(_uniform(len(items), parts))
    if lower == "parameters":
        return tuple(_spread_balanced([item.params for item in items], parts))
    # "type:REGEX": ModelShape checked the method
    regex = re.compile(method.split(":")[1], re.IGNORECASE)
    return tuple(_spread_balanced([1 if regex.search(item.name) else 0 for item in items], parts))


# --- DeepSpeed's rules (deepspeed/runtime/utils.py partition_uniform / partition_balanced) -----

def _uniform(n: int, parts: int) -> list[int]:
    if n <= parts:
        return [min(p, n) for p in range(parts + 1)]
    chunk, extra = divmod(n, parts)
    return [p * chunk + min(p, extra) for p in range(parts + 1)]  # the first `extra` stages take one more


def _spread_balanced(weights: Sequence[int], parts: int) -> list[int]:
    """DeepSpeed's dynamic programme: for each prefix and stage count it keeps the split whose
    (largest - smallest stage weight), built from the best split of a shorter prefix, is smallest;
    on a tie the later cut wins. Not min-max: its exact choices decide where DeepSpeed cuts."""
    n, inf = len(weights), float("inf")
    if n <= parts:
        return _uniform(n, parts)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    big = [[inf] * (parts + 1) for _ in range(n + 1)]
    small = [[inf] * (parts + 1) for _ in range(n + 1)]
    spread = [[inf] * (parts + 1) for _ in range(n + 1)]
    cut = [[0] * (parts + 1) for _ in range(n + 1)]
    big[0][0], spread[0][0] = 0, 0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(i):
                stage = prefix[i] - prefix[k]
                hi, lo = max(big[k][j - 1], stage), min(small[k][j - 1], stage)
                if spread[i][j] >= hi - lo:
                    spread[i][j], big[i][j], small[i][j], cut[i][j] = hi - lo, hi, lo, k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(cut[bounds[-1]][j])
    return bounds[::-1]


# --- ours: the most expensive stage as cheap as possible ---------------------------------------

def _min_max(values: Sequence[int], parts: int,
             cap: tuple[Sequence[int], float] | None = None) -> tuple[float, list[int]] | None:
    """Contiguous non-empty stages minimising the largest stage sum of `values`, optionally only
    among splits whose `cap[0]` sums stay <= cap[1]. Returns (largest sum, parts) or None."""
    n, inf = len(values), float("inf")
    prefix, cap_prefix = [0], [0]
    for i, v in enumerate(values):
        prefix.append(prefix[-1] + v)
        cap_prefix.append(cap_prefix[-1] + (cap[0][i] if cap else 0))
    best = [[inf] * (parts + 1) for _ in range(n + 1)]
    cut = [[0] * (parts + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(j - 1, i):  # k items before this stage, at least one per earlier stage
                if cap and cap_prefix[i] - cap_prefix[k] > cap[1]:
                    continue
                value = max(best[k][j - 1], prefix[i] - prefix[k])
                if value < best[i][j]:  # on a tie the earlier cut (later stages take more items)
                    best[i][j], cut[i][j] = value, k
    if best[n][parts] == inf:
        return None
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(cut[bounds[-1]][j])
    return best[n][parts], bounds[::-1]


def _flops_balanced(items: Sequence[PipeItem], parts: int) -> list[int]:
    flops = [item.flops for item in items]
    bottleneck, _ = _min_max(flops, parts)
    # among the splits with that bottleneck, the one with the smallest largest stage in parameters
    # (the weights, gradients and optimizer state a stage's ranks hold grow with them)
    return _min_max([item.params for item in items], parts, cap=(flops, bottleneck))[1]


def describe_stage(items: Iterable[PipeItem], num_layers: int) -> str:
    """e.g. "embedding, layers 1-4" / "layers 5-8, norm, output layer"."""
    parts, layers = [], [item.layer for item in items if item.name == TRANSFORMER_ITEM]
    for item in items:
        if item.layer == 0:
            parts.append("embedding")
        elif item.name == TRANSFORMER_ITEM and item.layer == layers[0]:
            parts.append(f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}")
        elif item.layer == num_layers + 1:
            parts.append("norm")
        elif item.layer == num_layers + 2:
            parts.append("output layer")
    return ", ".join(parts)
