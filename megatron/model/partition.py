"""Which pipeline stage holds which of GPTModelPipe's layers (torch-free).

GPTModelPipe hands DeepSpeed's PipelineModule one list of layer specs ("items"): the embedding,
the L transformer layers, (an MoE model: the function that keeps the moe loss), the final norm and
the output layer (the tied embedding copy, or the untied OutputLayer). A split is P + 1 item
boundaries `parts`: stage p holds items parts[p] .. parts[p + 1] - 1, as DeepSpeed's `parts`.

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
from functools import lru_cache
from typing import NamedTuple

from .analytic import (
    ParamSpec,
    _embedding_specs,
    _norm_specs,
    _output_layer_specs,
    _transformer_layer_or_moe_specs,
    held_by_expert_parallel_rank,
    layer_forward_flops,
    logits_forward_flops,
)
from .shape import ModelShape

DEFAULT_METHOD = "type:transformer"  # what an absent --pp-partition-method means (both forks)
FLOPS_METHOD = "flops"  # ours: balanced by cost
DEEPSPEED_METHODS = ("uniform", "parameters", "type:REGEX")
TRANSFORMER_ITEM = "ParallelTransformerLayerPipe"


class PipeItem(NamedTuple):
    name: str          # the class (function) name DeepSpeed's type:REGEX matches
    layer: int | None  # the parameter table's layer index (None: the MoE loss function, no parameters)
    params: int        # parameters one rank builds for it (TP-local, its EP rank's experts), as DeepSpeed counts
    flops: int         # model FLOPs per sample, forward + backward (no recompute: see stage_parts)


def _local(specs: Iterable[ParamSpec], shape: ModelShape) -> int:
    tp = shape.tensor_model_parallel_size
    return sum(spec.local_numel(tp) for spec in specs if held_by_expert_parallel_rank(shape, spec, 0))


@lru_cache(maxsize=64)
def pipe_items(shape: ModelShape) -> tuple[PipeItem, ...]:
    """GPTModelPipe's layer specs in order, as DeepSpeed sees them (a tuple: cached per shape)."""
    L = shape.num_layers
    # DeepSpeed builds the tied copy as a whole EmbeddingPipe (word and position tables)
    embedding = _local(_embedding_specs(shape, 0), shape)
    items = [PipeItem("EmbeddingPipe", 0, embedding, 0)]
    items += [PipeItem(TRANSFORMER_ITEM, i + 1, _local(_transformer_layer_or_moe_specs(shape, i + 1), shape),
                       3 * flops) for i, flops in enumerate(layer_forward_flops(shape))]
    if shape.is_moe:
        items.append(PipeItem("take", None, 0, 0))  # gpt_model.take
    norm = "RMSNorm" if shape.normalization == "rmsnorm" else "LayerNorm"
    norm_params = _local(_norm_specs(L + 1, "", shape.hidden_size, shape.normalization), shape)
    items.append(PipeItem(norm, L + 1, norm_params, 0))
    logits = 3 * logits_forward_flops(shape)
    if shape.tied:
        items.append(PipeItem("EmbeddingPipe", L + 2, _local(_embedding_specs(shape, L + 2, first_stage=False), shape),
                              logits))
    else:
        items.append(PipeItem("OutputLayer", L + 2, _local(_output_layer_specs(shape, L + 2), shape), logits))
    return tuple(items)


def method_error(method: str | None, shape: ModelShape) -> str | None:
    """One line naming --pp-partition-method and the fix, or None when the method applies."""
    choices = f"use {DEFAULT_METHOD} (the default), {FLOPS_METHOD}, {', '.join(DEEPSPEED_METHODS)}"
    if method is None or method.lower() in (FLOPS_METHOD, "uniform"):
        return None
    lower = method.lower()
    if lower == "parameters":
        if shape.embed_layernorm and shape.pipeline_model_parallel_size > 1:
            # DeepSpeed counts each layer on every rank, and only first-stage ranks build the
            # embedding LayerNorm: the ranks would disagree on the split
            return ("--pp-partition-method parameters with --embed-layernorm at PP > 1 splits differently on "
                    "different stages in DeepSpeed; use flops or type:transformer|embedding")
        return None
    if lower.startswith("type:"):
        pattern = method.split(":")[1]
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as e:
            return f"--pp-partition-method {method}: not a regular expression ({e})"
        if not any(regex.search(item.name) for item in pipe_items(shape)):
            names = sorted({item.name for item in pipe_items(shape)})
            return f"--pp-partition-method {method} matches none of the layers ({', '.join(names)}); {choices}"
        return None
    return f"--pp-partition-method {method} is unknown; {choices}"


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


@lru_cache(maxsize=64)
def stage_parts(shape: ModelShape) -> tuple[int, ...]:
    """The P + 1 item boundaries of the shape's pipeline split (see the module docstring). The
    cost-balanced split uses model FLOPs without activation recompute, so it is a property of the
    model and layout alone: a checkpoint resumes with or without --checkpoint-activations."""
    items, parts = pipe_items(shape), shape.pipeline_model_parallel_size
    method = (shape.pp_partition_method or DEFAULT_METHOD).lower()
    if method == FLOPS_METHOD:
        return tuple(_flops_balanced(items, parts))
    if method == "uniform":
        return tuple(_uniform(len(items), parts))
    if method == "parameters":
        return tuple(_spread_balanced([item.params for item in items], parts))
    regex = re.compile((shape.pp_partition_method or DEFAULT_METHOD).split(":")[1], re.IGNORECASE)
    return tuple(_spread_balanced([1 if regex.search(item.name) else 0 for item in items], parts))


def stage_items(shape: ModelShape) -> list[list[PipeItem]]:
    """[[PipeItem]] per stage."""
    items, parts = pipe_items(shape), stage_parts(shape)
    return [list(items[parts[p]:parts[p + 1]]) for p in range(len(parts) - 1)]


@lru_cache(maxsize=64)
def stage_of_item_layer(shape: ModelShape) -> dict[int, int]:
    """{table layer index: stage} for every item with parameters (cached: the table asks per tensor)."""
    return {item.layer: stage for stage, held in enumerate(stage_items(shape)) for item in held
            if item.layer is not None}


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
