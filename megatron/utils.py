"""The one home of parameter counting and of the FLOPs formula.

`compute_parameter_counts` runs once, right after the model is built: it counts the parameters
this rank *owns*, sums them over the model-parallel (TP x PP) group in one integer all-reduce,
and caches the result on `args`. The training logger only reads `args`; it never counts.

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

torch is imported lazily: tools/param_count.py uses the analytic half without it.
"""
COMPONENTS = ("word_embeddings", "position_embeddings", "attention", "mlp", "layernorm")
EMBEDDING_COMPONENTS = ("word_embeddings", "position_embeddings")


def pad_vocab_size(orig_vocab_size, make_vocab_size_divisible_by, tensor_model_parallel_size):
    """Megatron pads the vocab so that each TP rank's slice is a multiple of the divisor."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return ((orig_vocab_size + multiple - 1) // multiple) * multiple


def partition_layers(num_layers, num_stages):
    """Transformer layers per pipeline stage: as even as possible, earlier stages take the
    remainder. This is how DeepSpeed's `type:transformer` partitioning splits GPTModelPipe;
    the startup cross-check compares it with the stages actually built."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if stage < extra else 0) for stage in range(num_stages)]


# --- analytic counts: from the config alone -------------------------------------------------

def layer_parameter_counts(hidden_size, ffn_hidden_size):
    """Parameters of one transformer layer, by component."""
    h, f = hidden_size, ffn_hidden_size
    return {
        "attention": 3 * h * h + 3 * h + h * h + h,   # query_key_value + dense, weights and biases
        "mlp": h * f + f + f * h + h,                   # dense_h_to_4h + dense_4h_to_h
        "layernorm": 2 * 2 * h,                         # input_ + post_attention_layernorm
    }


def analytic_parameter_counts(num_layers, hidden_size, ffn_hidden_size, padded_vocab_size,
                              max_position_embeddings, pipeline_model_parallel_size=1):
    """Exact counts of the model as this code base builds it.

    Returns {"components": {name: count}, "total", "no_embedding", "stages": [owned count per
    stage]} where the output layer is the word embedding (counted once, on the first stage).
    """
    h = hidden_size
    layer = layer_parameter_counts(h, ffn_hidden_size)
    final_layernorm = 2 * h
    components = {
        "word_embeddings": padded_vocab_size * h,
        "position_embeddings": max_position_embeddings * h,
        "attention": num_layers * layer["attention"],
        "mlp": num_layers * layer["mlp"],
        "layernorm": num_layers * layer["layernorm"] + final_layernorm,
    }
    per_layer = sum(layer.values())
    stages = [n * per_layer for n in partition_layers(num_layers, pipeline_model_parallel_size)]
    stages[0] += components["word_embeddings"] + components["position_embeddings"]
    stages[-1] += final_layernorm
    total = sum(components.values())
    return {"components": components, "total": total,
            "no_embedding": total - sum(components[c] for c in EMBEDDING_COMPONENTS),
            "stages": stages}


def flops_per_sample(num_layers, hidden_size, ffn_hidden_size, seq_length, padded_vocab_size,
                     checkpoint_activations):
    """Model FLOPs of one training sample (forward + backward), Narayanan et al. 2021 eq. 3
    generalised to any FFN size. Per layer, forward: QKV 6sh^2, attention scores and context
    2 x 2s^2h, output projection 2sh^2, MLP 4shf. Backward costs twice the forward; activation
    recomputation adds one more forward (factor 4 instead of 3). The logit layer 2shV is never
    recomputed (factor 3). Elementwise work (LayerNorm, GeLU, softmax, biases) is ignored and
    causal attention is counted as dense, as the kernels compute it."""
    s, h, f = seq_length, hidden_size, ffn_hidden_size
    layer_forward = 8 * s * h * h + 4 * s * s * h + 4 * s * h * f
    factor = 4 if checkpoint_activations else 3
    return factor * num_layers * layer_forward + 3 * 2 * s * h * padded_vocab_size


def gigaflos_no_embeds(samples, seq_length, parameters_no_embedding):
    """Kaplan et al.'s compute C = 6 N D, N without embeddings, D tokens; in 1e9 units."""
    return 6 * samples * seq_length * parameters_no_embedding / 1e9


def flops_per_sample_from_args(args):
    return flops_per_sample(args.num_layers, args.hidden_size, args.ffn_hidden_size, args.seq_length,
                            args.padded_vocab_size, args.checkpoint_activations)


def analytic_parameter_counts_from_args(args):
    return analytic_parameter_counts(args.num_layers, args.hidden_size, args.ffn_hidden_size,
                                     args.padded_vocab_size, args.max_position_embeddings,
                                     args.pipeline_model_parallel_size)


# --- measured counts: from the built model, once --------------------------------------------

def _component_of_parameters(model):
    """id(param) -> component, from the module that holds it."""
    from megatron.model.layer_norm import LAYER_NORM_TYPES
    from megatron.model.transformer import ParallelAttention, ParallelMLP
    from megatron.model.language_model import Embedding
    from megatron.mpu import VocabParallelEmbedding

    component = {}
    for module in model.modules():
        if isinstance(module, ParallelAttention):
            name = "attention"
        elif isinstance(module, ParallelMLP):
            name = "mlp"
        elif isinstance(module, LAYER_NORM_TYPES):
            name = "layernorm"
        elif isinstance(module, VocabParallelEmbedding):
            name = "word_embeddings"
        elif isinstance(module, Embedding):
            component[id(module.position_embeddings.weight)] = "position_embeddings"
            continue
        else:
            continue
        for p in module.parameters():
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


def compute_parameter_counts(model, args, mpu):
    """Count once, cache on args. One collective: an int64 all-reduce over TP x PP holding the
    component totals and, per stage, (layers, elements held by its TP rank 0, owned elements)."""
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

    components = dict(zip(COMPONENTS, values[:len(COMPONENTS)]))
    stages = [tuple(values[len(COMPONENTS) + 3 * s: len(COMPONENTS) + 3 * s + 3]) for s in range(num_stages)]
    set_parameter_counts(args, components, stages)
    return args


def set_parameter_counts(args, components, stages):
    args.parameter_components = components
    args.parameter_stages = stages  # [(layers, elements on TP rank 0, owned elements)] per stage
    args.parameters = sum(components.values())
    args.parameters_no_embedding = args.parameters - sum(components[c] for c in EMBEDDING_COMPONENTS)
    args.parameters_in_billions = args.parameters / 1e9
    args.parameters_in_billions_no_embedding = args.parameters_no_embedding / 1e9
    args.flops_per_sample = flops_per_sample_from_args(args)


def parameter_count_mismatches(args):
    """Measured vs analytic, as human-readable lines (empty when they agree)."""
    expected = analytic_parameter_counts_from_args(args)
    problems = []
    for name in COMPONENTS:
        if args.parameter_components[name] != expected["components"][name]:
            problems.append(f"{name}: counted {args.parameter_components[name]:,}, "
                            f"formula {expected['components'][name]:,}")
    measured_stages = [owned for _, _, owned in args.parameter_stages]
    if measured_stages != expected["stages"]:
        problems.append(f"per-stage owned parameters: counted {measured_stages}, formula {expected['stages']}")
    return problems


def format_parameter_report(args):
    """The startup lines. The first two keep Megatron-DeepSpeed's wording (scripts grep them)."""
    lines = [
        f"estimated model parameters: {args.parameters_in_billions}",
        f"estimated model parameters without embeddings: {args.parameters_in_billions_no_embedding}",
        f"model parameters (exact): {args.parameters:,} total, {args.parameters_no_embedding:,} without "
        f"embeddings (TP={args.tensor_model_parallel_size} PP={args.pipeline_model_parallel_size} "
        f"DP={args.data_parallel_size}, padded vocab {args.padded_vocab_size})",
        "  stage | layers | params per TP rank 0 | owned params (all TP ranks)",
    ]
    for stage, (layers, local, owned) in enumerate(args.parameter_stages):
        lines.append(f"  {stage:5d} | {layers:6d} | {local:20,} | {owned:,}")
    lines.append("  component           | params")
    for name in COMPONENTS:
        lines.append(f"  {name:19s} | {args.parameter_components[name]:,}")
    lines.append(f"FLOPs per sample (model, fwd+bwd{', recompute' if args.checkpoint_activations else ''}): "
                 f"{args.flops_per_sample:,}")
    return lines
