"""THE home of the parameter count: measured once, right after the model is built.

`compute_parameter_counts` counts the parameters this rank *owns*, sums them over the
model-parallel (TP x PP) group in one integer all-reduce and returns a ParameterCounts, which
the trainer caches on `args` (`cache_parameter_counts`). The training logger only reads `args`.

Ownership, so that every parameter of the model is counted exactly once:
  * a parameter split across TP ranks (tagged `tensor_model_parallel`) counts on every TP rank,
    each rank holding a different slice;
  * a replicated parameter (no tag: LayerNorms, row-parallel biases, position embeddings)
    counts on TP rank 0 only;
  * a parameter of a tied module that DeepSpeed marked `ds_pipe_replicated` (the last stage's
    copy of the "embed" TiedLayerSpec) does not count: the first stage owns it;
  * a tensor reachable twice in one module (a plain tied output layer) counts once;
  * a ZeRO-3 partitioned parameter counts its full size (`ds_numel`).
DP replicas hold the same parameters and are not summed.

Each parameter's component is its entry in the parameter table (megatron/model/analytic.py),
found by name and checked by shape (`match_parameters_to_table`); a parameter the table does not
list, a shape or a count that differs from the table's stops the run before training.

The analytic side (the same numbers from the shape alone) lives in megatron/model/analytic.py.
torch is imported lazily: tools/param_count.py uses this module's report without it.
"""
from argparse import Namespace
from collections.abc import Callable
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING

from megatron.model.analytic import (
    COMPONENTS,
    ParameterCounts,
    ParamSpec,
    StageCount,
    analytic_parameter_counts,
    experts_per_expert_parallel_rank,
    flops_convention_line,
    flops_per_sample,
    stage_items,
)
from megatron.model.partition import DEFAULT_METHOD, describe_stage
from megatron.model.shape import ModelShape

if TYPE_CHECKING:
    import torch


def _expert_parallel_first_experts(model):
    """id(param) -> global index of the first expert of its MoE layer on this rank (the table names
    experts by global index; DeepSpeed by local index within the EP rank)."""
    from megatron.model.moe import mpu_ep_rank_first_expert
    return {id(p): mpu_ep_rank_first_expert(layer) for layer in _moe_layers(model)
            for p in layer.deepspeed_moe.experts.parameters()}


def _table_entry_name(name, first_expert, pipe_shift_after):
    """A built name as the table names it: a local expert index renamed to the global one; in an
    MoE GPTModelPipe, the layers after the moe-loss function (a pipe index of its own, no
    parameters) moved back by one."""
    import re

    from megatron.model.analytic import EXPERT_PREFIX
    index = re.match(r"(\d+)\.", name)
    if pipe_shift_after is not None and index and int(index.group(1)) > pipe_shift_after:
        name = f"{int(index.group(1)) - 1}{name[index.end() - 1:]}"
    if first_expert and EXPERT_PREFIX in name:
        head, tail = name.split(EXPERT_PREFIX, 1)
        local, rest = tail.split(".", 1)
        return f"{head}{EXPERT_PREFIX}{first_expert + int(local)}.{rest}"
    return name


def match_parameters_to_table(model: "torch.nn.Module", shape: ModelShape) -> dict[int, ParamSpec]:
    """id(param) -> its entry of the parameter table (megatron/model/analytic.py), matched by name
    (GPTModel's or GPTModelPipe's, experts by global index) and by shape (this rank's TP slice of
    the entry's full shape). A parameter the table does not list, or whose shape differs from its
    entry's, stops the run (ConfigError) naming both."""
    from deepspeed.pipe import PipelineModule

    from megatron.model.analytic import table_entry
    from megatron.runtime.refusal import ConfigError

    pipeline = isinstance(model, PipelineModule)
    tp = shape.tensor_model_parallel_size
    first_expert = _expert_parallel_first_experts(model)
    moe_loss_index = shape.num_layers + 1 if pipeline and getattr(model, "moe_loss", None) is not None else None
    entries = {}
    for name, p in model.named_parameters():
        spec = table_entry(_table_entry_name(name, first_expert.get(id(p), 0), moe_loss_index), shape, pipeline)
        built = tuple(getattr(p, "ds_shape", None) or p.shape)
        if spec is None:
            raise ConfigError(f"the built model holds {name} {built} that the parameter table "
                              f"(megatron/model/analytic.py) does not list ({shape_flags(shape)})")
        split = spec.partition_dim is not None and getattr(p, "tensor_model_parallel", False)
        expected = tuple(n // tp if split and dim == spec.partition_dim else n for dim, n in enumerate(spec.shape))
        if built != expected:
            raise ConfigError(f"{spec.component}: the built {name} has shape {built}, the parameter table "
                              f"{expected} ({shape_flags(shape)})")
        entries[id(p)] = spec
    return entries


def shape_flags(shape: ModelShape) -> str:
    """The model's flag combination, as its shape's fields that differ from the defaults."""
    from dataclasses import fields
    return " ".join(f"{f.name}={getattr(shape, f.name)}" for f in fields(shape) if getattr(shape, f.name) != f.default)


def _component_of_parameters(model, shape):
    """id(param) -> component, from the parameter table's entry of each parameter."""
    return {key: spec.component for key, spec in match_parameters_to_table(model, shape).items()}


def _numel(param):
    return getattr(param, "ds_numel", None) or param.numel()


def is_owned_parameter(param: "torch.Tensor", tp_rank: int) -> bool:
    """Whether this rank owns `param` for counting (and for the gradient norm): not DeepSpeed's
    non-owner copy of a tied module, and, if TP-replicated, only on TP rank 0."""
    if getattr(param, "ds_pipe_replicated", False):
        return False
    return tp_rank == 0 or getattr(param, "tensor_model_parallel", False)


def count_local_parameters(model: "torch.nn.Module", tp_rank: int,
                           shape: ModelShape) -> tuple[dict[str, int], int, int]:
    """This rank's view: ({component: owned count}, all local elements, transformer layers)."""
    from megatron.model.transformer import ParallelTransformerLayer

    component = _component_of_parameters(model, shape)
    owned = dict.fromkeys(COMPONENTS, 0)
    local = 0
    for p in model.parameters():  # yields a tensor once even if two modules share it
        local += _numel(p)
        if not is_owned_parameter(p, tp_rank):
            continue
        owned[component[id(p)]] += _numel(p)
    layers = sum(isinstance(m, ParallelTransformerLayer) for m in model.modules())
    return owned, local, layers


def _count_buffer(size: int) -> "torch.Tensor":
    """The int64 zeros the counts are all-reduced in: on this rank's GPU where there is one (nccl
    reduces CUDA tensors only), on the CPU for gloo."""
    import torch
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return torch.zeros(size, dtype=torch.int64, device=device)


def compute_parameter_counts(model: "torch.nn.Module", mpu: ModuleType, shape: ModelShape) -> ParameterCounts:
    """The whole model's ParameterCounts, the same on every rank. One collective: an int64
    all-reduce over TP x PP holding the component totals and, per stage, (layers, elements held
    by its TP rank 0, owned elements)."""
    import torch
    import torch.distributed as dist

    if is_moe_model(model):
        return compute_moe_parameter_counts(model, mpu, shape)

    tp_rank = mpu.get_tensor_model_parallel_rank()
    stage, num_stages = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()
    owned, local, layers = count_local_parameters(model, tp_rank, shape)

    buf = _count_buffer(len(COMPONENTS) + 3 * num_stages)
    buf[:len(COMPONENTS)] = torch.tensor([owned[c] for c in COMPONENTS])
    slot = len(COMPONENTS) + 3 * stage
    if tp_rank == 0:
        buf[slot], buf[slot + 1] = layers, local
    buf[slot + 2] = sum(owned.values())
    if dist.is_initialized():
        dist.all_reduce(buf, group=mpu.get_model_parallel_group())
    values = buf.tolist()
    stages = values[len(COMPONENTS):]
    return ParameterCounts(dict(zip(COMPONENTS, values[:len(COMPONENTS)], strict=True)),
                           tuple(StageCount(*stages[3 * s: 3 * s + 3]) for s in range(num_stages)))


# --- mixture of experts ---------------------------------------------------------------------------
# Expert parameters (DeepSpeed tags them `allreduce = False`) are replicated over the
# expert-data-parallel (EDP) group, not over DP: EP rank r of a layer holds experts
# [r E/EP, (r+1) E/EP) and the EDP group holds copies of those. Counted once each: an expert
# parameter counts on EDP rank 0 (and, when the experts are TP-split, as any TP parameter: split
# ones on every TP rank, replicated ones on TP rank 0); every other parameter counts on DP rank 0
# under the dense rule. The sum runs over all ranks (the EP ranks of a layer sit in different DP
# replicas, and without expert TP also in different TP ranks), in one int64 all-reduce.

def _moe_layers(model):
    from deepspeed.moe.layer import MoE
    return [m for m in model.modules() if isinstance(m, MoE)]


def is_moe_model(model: "torch.nn.Module") -> bool:
    """From the model, not this rank's modules: a pipeline stage may hold no MoE layer, and every
    rank must take the same (collective) path."""
    return getattr(model, "is_moe", False) or bool(_moe_layers(model))


def moe_parameter_owner(model: "torch.nn.Module",
                        mpu: ModuleType) -> "Callable[[torch.Tensor], bool] | None":
    """owned(param) for an MoE model on this rank (the rule above); None for a dense model."""
    from megatron.runtime.deepspeed_internals import expert_data_parallel_rank, is_expert_parameter

    if not is_moe_model(model):
        return None
    layers = _moe_layers(model)
    tp_rank, dp_rank = mpu.get_tensor_model_parallel_rank(), mpu.get_data_parallel_rank()
    expert_tp = bool(layers) and layers[0].enable_expert_tensor_parallelism
    edp_rank = {layer.expert_group_name: expert_data_parallel_rank(layer.expert_group_name)
                for layer in layers}

    def owned(param: "torch.Tensor") -> bool:
        if is_expert_parameter(param):
            tp_owned = not expert_tp or tp_rank == 0 or getattr(param, "tensor_model_parallel", False)
            return edp_rank[param.group_name] == 0 and tp_owned  # type: ignore[attr-defined]  # DeepSpeed's tag
        return dp_rank == 0 and is_owned_parameter(param, tp_rank)
    return owned


def compute_moe_parameter_counts(model: "torch.nn.Module", mpu: ModuleType,
                                 shape: ModelShape) -> ParameterCounts:
    """compute_parameter_counts for a model with MoE layers: the same ParameterCounts plus the
    active expert parameters (per MoE layer, its experts' total / E x top-k, measured)."""
    import torch
    import torch.distributed as dist
    from deepspeed.moe.layer import MoE

    from megatron.model.transformer import ParallelTransformerLayer

    owned_fn = moe_parameter_owner(model, mpu)
    tp_rank, dp_rank = mpu.get_tensor_model_parallel_rank(), mpu.get_data_parallel_rank()
    stage, num_stages = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()
    component = _component_of_parameters(model, shape)
    layers = [m for m in model.modules() if isinstance(m, ParallelTransformerLayer)]
    # one slot per layer of the model, on every stage (a stage may hold no transformer layer)
    num_layers = getattr(model, "num_transformer_layers", None) or layers[0].total_layers
    owned = dict.fromkeys(COMPONENTS, 0)
    # per layer of the model: (owned expert elements, E, top-k); E and k from one rank per stage
    experts_by_layer = [0] * (3 * num_layers)
    local = 0
    for layer in layers:
        if isinstance(layer.mlp, MoE):
            experts = layer.mlp.deepspeed_moe.experts.parameters()
            i = 3 * (layer.layer_number - 1)
            experts_by_layer[i] = sum(_numel(p) for p in experts if owned_fn(p))
            if tp_rank == 0 and dp_rank == 0:
                experts_by_layer[i + 1:i + 3] = layer.mlp.num_experts, layer.mlp.deepspeed_moe.gate.k
    for p in model.parameters():
        local += _numel(p)
        if not owned_fn(p):
            continue
        owned[component[id(p)]] += _numel(p)

    n = len(COMPONENTS)
    buf = _count_buffer(n + 3 * num_stages + 3 * num_layers)
    buf[:n] = torch.tensor([owned[c] for c in COMPONENTS])
    slot = n + 3 * stage
    if tp_rank == 0 and dp_rank == 0:  # what DeepSpeed's STAGE_PARAMS would say on TP rank 0, EP rank 0
        buf[slot], buf[slot + 1] = len(layers), local
    buf[slot + 2] = sum(owned.values())
    buf[n + 3 * num_stages:] = torch.tensor(experts_by_layer)
    if dist.is_initialized():
        dist.all_reduce(buf)  # every rank: TP x PP x EP and the (expert-)data-parallel replicas
    values = buf.tolist()
    stages = values[n:n + 3 * num_stages]
    experts_active = 0
    by_layer = values[n + 3 * num_stages:]
    for number in range(1, num_layers + 1):
        total, num_experts, k = by_layer[3 * number - 3:3 * number]
        if num_experts:  # an MoE layer, on whichever stage
            per_expert, rest = divmod(total, num_experts)
            assert rest == 0, f"layer {number}: experts of unequal size"
            experts_active += k * per_expert
    return ParameterCounts(dict(zip(COMPONENTS, values[:n], strict=True)),
                           tuple(StageCount(*stages[3 * s: 3 * s + 3]) for s in range(num_stages)), experts_active)


# what cache_parameter_counts writes: the only names written onto args after initialize_megatron
# (megatron/config/run_config.py: FrozenArgs refuses any other)
COUNT_CACHE = ("parameter_counts", "parameter_components", "parameter_stages", "parameters", "parameters_no_embedding",
               "parameters_in_billions", "parameters_in_billions_no_embedding", "parameters_active",
               "parameters_active_no_embedding", "parameters_active_in_billions",
               "parameters_active_in_billions_no_embedding", "flops_per_sample", "model_flops_per_sample",
               "flops_per_sample_at", "model_flops_per_sample_at")


def cache_parameter_counts(args: Namespace, counts: ParameterCounts) -> Namespace:
    """The names users and scripts read: args.parameters, args.parameters_no_embedding, the
    *_in_billions floats, and the FLOPs per sample that follow from the same shape. Once, after
    the model is built."""
    args.parameter_counts = counts
    args.parameter_components = counts.components
    args.parameter_stages = counts.stages  # [(layers, elements on TP rank 0, owned elements)] per stage
    args.parameters = counts.total
    args.parameters_no_embedding = counts.no_embedding
    args.parameters_in_billions = args.parameters / 1e9
    args.parameters_in_billions_no_embedding = args.parameters_no_embedding / 1e9
    # MoE: parameters per token (top-k experts); equal to the totals for a dense model
    args.parameters_active = counts.active
    args.parameters_active_no_embedding = counts.active_no_embedding
    args.parameters_active_in_billions = args.parameters_active / 1e9
    args.parameters_active_in_billions_no_embedding = args.parameters_active_no_embedding / 1e9
    # the run's FLOPs per sample, here and nowhere else: with recompute (the log line's TFLOPs,
    # hardware FLOPs as Megatron-DeepSpeed counts them) and without (the model's, for MFU)
    # in the --flops-attention convention (analytic.py: FLOPS_CONVENTIONS)
    causal = getattr(args, "flops_attention", "full") == "causal"
    args.flops_per_sample = flops_per_sample(args.model_shape, args.checkpoint_activations,
                                             args.activations_checkpoint_method, args.checkpoint_num_layers,
                                             causal=causal)
    args.model_flops_per_sample = flops_per_sample(args.model_shape, checkpoint_activations=False, causal=causal)
    # the same per trained sequence length: --seq-length and every length of a curriculum
    # (megatron/schedules/curriculum.py); the logger looks up the lengths its iterations trained at
    curriculum = getattr(args, "curriculum", None)
    lengths = sorted({args.model_shape.seq_length, *(curriculum.seqlens() if curriculum else ())})
    args.flops_per_sample_at = MappingProxyType({s: flops_per_sample(
        args.model_shape, args.checkpoint_activations, args.activations_checkpoint_method, args.checkpoint_num_layers,
        seq_length=s, causal=causal) for s in lengths})
    args.model_flops_per_sample_at = MappingProxyType(
        {s: flops_per_sample(args.model_shape, checkpoint_activations=False, seq_length=s, causal=causal)
         for s in lengths})
    return args


def check_parameter_counts(measured: ParameterCounts, shape: ModelShape) -> None:
    """Stops the run (ConfigError, one line) when the built model's counts differ from the
    parameter table's in any component or stage: the FLOPs, memory and export that follow from
    the table would describe another model than the one being trained."""
    from megatron.runtime.refusal import ConfigError
    problems = parameter_count_mismatches(measured, shape)
    if problems:
        raise ConfigError(f"the built model disagrees with the parameter table (megatron/model/analytic.py): "
                          f"{'; '.join(problems)} ({shape_flags(shape)})")


def parameter_count_mismatches(measured: ParameterCounts, shape: ModelShape) -> list[str]:
    """Measured vs analytic, as human-readable lines (empty when they agree)."""
    expected = analytic_parameter_counts(shape)
    problems = [f"{name}: counted {measured.components[name]:,}, formula {expected.components[name]:,}"
                for name in COMPONENTS if measured.components[name] != expected.components[name]]
    for field in StageCount._fields:
        ours, theirs = ([getattr(s, field) for s in c.stages] for c in (measured, expected))
        if ours != theirs:
            problems.append(f"per-stage {field} parameters: counted {ours}, formula {theirs}")
    if measured.experts_active != expected.experts_active:
        problems.append(f"active expert parameters: counted {measured.experts_active:,}, "
                        f"formula {expected.experts_active:,}")
    return problems


def format_parameter_report(counts: ParameterCounts, shape: ModelShape, data_parallel_size: int | None = None,
                            checkpoint_activations: bool = False, checkpoint_method: str | None = None,
                            checkpoint_num_layers: int = 1, flops: int | None = None,
                            sequence_parallel_size: int = 1, causal_attention: bool = False) -> list[str]:
    """The startup report, the same from the trainer (measured) and tools/param_count.py
    (analytic). The first two lines keep Megatron-DeepSpeed's wording (scripts grep them).
    `flops`: the FLOPs per sample for these recompute settings where the caller has them (the
    trainer's cache, args.flops_per_sample); computed here otherwise. `sequence_parallel_size`:
    DeepSpeed-Ulysses' SP ranks per replica, which share each sample's FLOPs evenly (s/SP tokens
    each, and heads/SP of the attention core over all s). `causal_attention`: the FLOPs convention
    (--flops-attention causal), stated in a line before the FLOPs."""
    tp, pp, sp = shape.tensor_model_parallel_size, shape.pipeline_model_parallel_size, sequence_parallel_size
    dp = f" DP={data_parallel_size}" if data_parallel_size else ""
    dp += f" SP={sp}" if sp > 1 else ""
    lines = [
        f"estimated model parameters: {counts.total / 1e9}",
        f"estimated model parameters without embeddings: {counts.no_embedding / 1e9}",
        f"model parameters (exact): {counts.total:,} total, {counts.no_embedding:,} without "
        f"embeddings (TP={tp} PP={pp}{dp}, padded vocab {shape.padded_vocab_size})",
        f"architecture: {shape.describe()}",
    ] + moe_report_lines(counts, shape) + [
        "  stage | layers | params per TP rank 0 | owned params (all TP ranks)",
    ]
    lines += [f"  {stage:5d} | {s.layers:6d} | {s.held:20,} | {s.owned:,}" for stage, s in enumerate(counts.stages)]
    lines += pipeline_split_lines(shape)
    lines.append("  component           | params")
    # the components this variant has (a rotary model has no position table, a tied one no output layer)
    lines += [f"  {name:19s} | {counts.components[name]:,}" for name in COMPONENTS if counts.components[name]]
    recompute = ""
    if checkpoint_activations:
        recompute = (f", recompute of the first {checkpoint_num_layers} layer(s) of each stage"
                     if checkpoint_method == "block" else ", recompute")
    if flops is None:
        flops = flops_per_sample(shape, checkpoint_activations, checkpoint_method, checkpoint_num_layers,
                                 causal=causal_attention)
    lines.append(flops_convention_line(causal_attention))  # before the numbers it describes
    lines.append(f"FLOPs per sample (model, fwd+bwd{recompute}): {flops:,}")
    if sp > 1:
        lines.append(f"FLOPs per sample per SP rank (DeepSpeed-Ulysses, SP={sp}): {flops // sp:,}")
    return lines


def pipeline_split_lines(shape: ModelShape) -> list[str]:
    """Each stage's layers and share of the model FLOPs (forward + backward, no recompute), so the
    imbalance of any split shows; the memory table gives each stage's predicted bytes."""
    if shape.pipeline_model_parallel_size == 1:
        return []
    method = shape.pp_partition_method or f"{DEFAULT_METHOD}, the default: the forks' even spread of the layers"
    per_stage = stage_items(shape)
    total = sum(item.flops for items in per_stage for item in items)
    lines = [f"pipeline split (--pp-partition-method {method}):", "  stage | holds" + " " * 30 + "| FLOPs share"]
    for stage, items in enumerate(per_stage):
        share = 100 * sum(item.flops for item in items) / total
        lines.append(f"  {stage:5d} | {describe_stage(items, shape.num_layers):34s} | {share:.2f}%")
    return lines


def moe_report_lines(counts: ParameterCounts, shape: ModelShape) -> list[str]:
    """The active count (what a token passes through) and each EP rank's share of the experts."""
    if not shape.is_moe:
        return []
    experts, params = experts_per_expert_parallel_rank(shape)
    ep = shape.moe_expert_parallel_size
    split = "TP-split" if shape.enable_expert_tensor_parallelism else "whole on each TP rank"
    moe = [e for e in shape.experts_per_layer() if e > 1]
    layers = f"{len(moe)} MoE layers of {moe[0]} experts" if len(set(moe)) == 1 else f"MoE layers of {moe} experts"
    return [
        f"estimated active model parameters: {counts.active / 1e9}",
        f"estimated active model parameters without embeddings: {counts.active_no_embedding / 1e9}",
        f"active parameters per token (exact): {counts.active:,}, {counts.active_no_embedding:,} without "
        f"embeddings (top-{shape.topk}, {layers}{', PR-MoE' if shape.mlp_type == 'residual' else ''})",
        f"experts per EP rank (EP={ep}): {experts} experts, {params:,} expert parameters ({split}); "
        f"expert parameters in all: {counts.components['experts']:,}",
    ]
