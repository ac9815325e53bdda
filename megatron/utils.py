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

The analytic side (the same numbers from the shape alone) lives in megatron/model/analytic.py.
torch is imported lazily: tools/param_count.py uses this module's report without it.
"""
from megatron.model.analytic import (COMPONENTS, ParameterCounts, StageCount, analytic_parameter_counts,
                                     flops_per_sample)


def _component_of_parameters(model):
    """id(param) -> component, from the module that holds it."""
    from megatron.model.language_model import Embedding, OutputLayer
    from megatron.model.layer_norm import LAYER_NORM_TYPES
    from megatron.model.transformer import ParallelAttention, ParallelMLP
    from megatron.mpu import VocabParallelEmbedding

    component = {}
    embeddings = []
    for module in model.modules():
        if isinstance(module, ParallelAttention):
            name = "attention"
        elif isinstance(module, ParallelMLP):
            name = "mlp"
        elif isinstance(module, LAYER_NORM_TYPES):
            name = "layernorm"  # LayerNorm or RMSNorm
        elif isinstance(module, VocabParallelEmbedding):
            name = "word_embeddings"
        elif isinstance(module, OutputLayer):
            name = "output_layer"
        elif isinstance(module, Embedding):
            embeddings.append(module)
            continue
        else:
            continue
        for p in module.parameters():
            component[id(p)] = name
    for module in embeddings:  # its own norm and table, after the generic LayerNorm rule above
        for name in ("position_embeddings", "embedding_layernorm"):
            if getattr(module, name) is not None:
                for p in getattr(module, name).parameters():
                    component[id(p)] = name
    return component


def _numel(param):
    return getattr(param, "ds_numel", None) or param.numel()


def is_owned_parameter(param, tp_rank):
    """Whether this rank owns `param` for counting (and for the gradient norm): not DeepSpeed's
    non-owner copy of a tied module, and, if TP-replicated, only on TP rank 0."""
    if getattr(param, "ds_pipe_replicated", False):
        return False
    return tp_rank == 0 or getattr(param, "tensor_model_parallel", False)


def count_local_parameters(model, tp_rank):
    """This rank's view: ({component: owned count}, all local elements, transformer layers)."""
    from megatron.model.transformer import ParallelTransformerLayer

    component = _component_of_parameters(model)
    owned = dict.fromkeys(COMPONENTS, 0)
    local = 0
    for p in model.parameters():  # yields a tensor once even if two modules share it
        local += _numel(p)
        if not is_owned_parameter(p, tp_rank):
            continue
        if id(p) not in component:
            raise RuntimeError(f"parameter of shape {tuple(p.shape)} belongs to no known component; "
                               f"teach megatron.utils._component_of_parameters about its module")
        owned[component[id(p)]] += _numel(p)
    layers = sum(isinstance(m, ParallelTransformerLayer) for m in model.modules())
    return owned, local, layers


def compute_parameter_counts(model, mpu):
    """The whole model's ParameterCounts, the same on every rank. One collective: an int64
    all-reduce over TP x PP holding the component totals and, per stage, (layers, elements held
    by its TP rank 0, owned elements)."""
    import torch
    import torch.distributed as dist

    tp_rank = mpu.get_tensor_model_parallel_rank()
    stage, num_stages = mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()
    owned, local, layers = count_local_parameters(model, tp_rank)

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    buf = torch.zeros(len(COMPONENTS) + 3 * num_stages, dtype=torch.int64, device=device)
    buf[:len(COMPONENTS)] = torch.tensor([owned[c] for c in COMPONENTS])
    slot = len(COMPONENTS) + 3 * stage
    if tp_rank == 0:
        buf[slot], buf[slot + 1] = layers, local
    buf[slot + 2] = sum(owned.values())
    if dist.is_initialized():
        dist.all_reduce(buf, group=mpu.get_model_parallel_group())
    values = buf.tolist()
    stages = values[len(COMPONENTS):]
    return ParameterCounts(dict(zip(COMPONENTS, values[:len(COMPONENTS)])),
                           tuple(StageCount(*stages[3 * s: 3 * s + 3]) for s in range(num_stages)))


def cache_parameter_counts(args, counts):
    """The names users and scripts read: args.parameters, args.parameters_no_embedding, the
    *_in_billions floats, and the FLOPs per sample that follow from the same shape."""
    args.parameter_counts = counts
    args.parameter_components = counts.components
    args.parameter_stages = counts.stages  # [(layers, elements on TP rank 0, owned elements)] per stage
    args.parameters = counts.total
    args.parameters_no_embedding = counts.no_embedding
    args.parameters_in_billions = args.parameters / 1e9
    args.parameters_in_billions_no_embedding = args.parameters_no_embedding / 1e9
    args.flops_per_sample = flops_per_sample(args.model_shape, args.checkpoint_activations)
    return args


def parameter_count_mismatches(measured, shape):
    """Measured vs analytic, as human-readable lines (empty when they agree)."""
    expected = analytic_parameter_counts(shape)
    problems = [f"{name}: counted {measured.components[name]:,}, formula {expected.components[name]:,}"
                for name in COMPONENTS if measured.components[name] != expected.components[name]]
    for field in StageCount._fields:
        ours, theirs = ([getattr(s, field) for s in c.stages] for c in (measured, expected))
        if ours != theirs:
            problems.append(f"per-stage {field} parameters: counted {ours}, formula {theirs}")
    return problems


def format_parameter_report(counts, shape, data_parallel_size=None, checkpoint_activations=False):
    """The startup report, the same from the trainer (measured) and tools/param_count.py
    (analytic). The first two lines keep Megatron-DeepSpeed's wording (scripts grep them)."""
    tp, pp = shape.tensor_model_parallel_size, shape.pipeline_model_parallel_size
    dp = f" DP={data_parallel_size}" if data_parallel_size else ""
    lines = [
        f"estimated model parameters: {counts.total / 1e9}",
        f"estimated model parameters without embeddings: {counts.no_embedding / 1e9}",
        f"model parameters (exact): {counts.total:,} total, {counts.no_embedding:,} without "
        f"embeddings (TP={tp} PP={pp}{dp}, padded vocab {shape.padded_vocab_size})",
        f"architecture: {shape.describe()}",
        "  stage | layers | params per TP rank 0 | owned params (all TP ranks)",
    ]
    lines += [f"  {stage:5d} | {s.layers:6d} | {s.held:20,} | {s.owned:,}" for stage, s in enumerate(counts.stages)]
    lines.append("  component           | params")
    # the components this variant has (a rotary model has no position table, a tied one no output layer)
    lines += [f"  {name:19s} | {counts.components[name]:,}" for name in COMPONENTS if counts.components[name]]
    lines.append(f"FLOPs per sample (model, fwd+bwd{', recompute' if checkpoint_activations else ''}): "
                 f"{flops_per_sample(shape, checkpoint_activations):,}")
    return lines
