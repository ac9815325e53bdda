"""Memory per rank from the config alone (torch-free): weights, gradients and optimizer state,
exactly as this trainer and DeepSpeed 0.19.8 allocate them, and an activation estimate.

Definitions (what megatron/metrics/memory_measure.py measures, tensor storage bytes, shared storage once):
  weights    the storage behind the model's parameters (DeepSpeed's flat buffers where it flattens);
  gradients  what is held when the optimizer step starts (after backward and the DP reduction);
  optimizer  what the optimizer holds after its first step: fp32 master copies that are not the
             weights themselves, Adam's exp_avg / exp_avg_sq (SGD's momentum) and step tensors.
Which DeepSpeed optimizer runs follows `DeepSpeedEngine._do_optimizer_sanity_check`:
  fp32, ZeRO 0          the client torch optimizer, unwrapped (apex FusedAdam on CUDA when installed)
  fp16 / bf16, ZeRO 0   pipeline engine + bf16: BF16_Optimizer; otherwise FP16_UnfusedOptimizer
                        (FP16_Optimizer with a fused Adam)
  ZeRO 1 / 2            DeepSpeedZeroOptimizer (bf16 ZeRO 1 with data_types.grad_accum_dtype fp32,
                        i.e. --accumulate-allreduce-grads-in-fp32: BF16_Optimizer);
                        ZeRO 3: DeepSpeedZeroOptimizer_Stage3
DeepSpeed flattens each param group (ours: weight-decayed matrices, then 1-D biases and norms)
into one buffer padded to a multiple of 2 x DP elements (`nccl_start_alignment_factor`) and
gives DP rank d the d-th equal slice of it. With contiguous gradients, ZeRO 1/2 copy the
gradients of every parameter that overlaps the rank's slice (whole parameters) into one buffer.

Not in the table, because they are transient: ZeRO 1/2's reduce bucket (`reduce_bucket_size`
elements of the model dtype, twice with `overlap_comm`, allocated at every reduction), ZeRO 1's
full unreduced gradient at the end of backward, the fp32 gradient copies mixed-precision
optimizers create inside `step()`, and the flat copy DeepSpeed all-reduces ZeRO-0 gradients
through when DP > 1. They are listed as `transient`.

Activations are an estimate (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", counted for our layers): the bytes autograd saves for backward.

DeepSpeed-Ulysses (SP ranks per replica): the weights are replicated on the SP x DP ranks, and
DeepSpeed partitions ZeRO state over all of them (its sequence-data-parallel group), so "dp rank"
below is the rank in that group; activations are per token on s/SP tokens, except the attention
core, which holds every position of heads/SP heads (see layer_activation_bytes).
"""
from argparse import Namespace
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import ceil
from typing import NamedTuple

from megatron.model.analytic import layers_per_stage, stage_parameters
from megatron.model.shape import ModelShape
from megatron.runtime.precision import softmax_in_fp32

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MASTER_BYTES = 4  # fp32 master weights, Adam moments and DeepSpeed's fp32 partitions
STEP_BYTES = 4    # torch.optim.AdamW's per-parameter `step`: a 0-dim fp32 tensor
REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's zero_optimization.reduce_bucket_size default
SUB_GROUP_SIZE = 1_000_000_000    # zero_optimization.sub_group_size default (ZeRO 3)
PERSISTENCE_THRESHOLD = 100_000   # zero_optimization.stage3_param_persistence_threshold default
MOE_ACTIVATIONS_NOTE = " (MoE layers counted as dense ones: routing and capacity buffers not included)"
WRAPPER_NAMES = {"torch": "torch optimizer", "fp16_unfused": "FP16_UnfusedOptimizer", "fp16_fused": "FP16_Optimizer",
                 "bf16": "BF16_Optimizer", "zero": "DeepSpeedZeroOptimizer",
                 "zero3": "DeepSpeedZeroOptimizer_Stage3"}


@dataclass(frozen=True)
class TrainingSetup:
    """What memory depends on beyond the model's shape."""
    precision: str = "fp32"            # fp32 | fp16 | bf16
    zero_stage: int = 0
    data_parallel_size: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1         # per iteration and DP rank (gradient accumulation steps)
    pipeline: bool = True              # DeepSpeed's pipeline engine (False: --no-pipeline-parallel)
    optimizer: str = "adam"            # adam | sgd
    sgd_momentum: float = 0.9
    fused_adam: bool = False           # apex FusedAdam (CUDA with apex installed)
    checkpoint_activations: bool = False
    checkpoint_num_layers: int = 1
    checkpoint_method: str = "uniform"  # or "block": only the first checkpoint_num_layers of a stage
    attention_impl: str = "sdpa"
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    reduce_bucket_size: int = REDUCE_BUCKET_SIZE
    overlap_comm: bool = False
    sub_group_size: int = SUB_GROUP_SIZE                 # ZeRO 3: elements per fp32 sub group (one step each)
    param_persistence_threshold: int = PERSISTENCE_THRESHOLD  # ZeRO 3: parameters this small stay gathered
    grad_accum_dtype: str | None = None  # ds_config data_types.grad_accum_dtype; None: the model dtype
    moe: bool = False                    # an MoE model: DeepSpeed reduces the gradients even at DP = 1
    sequence_parallel: bool = False      # --sequence-parallel at TP > 1 (validation turns it off at TP 1)
    sequence_parallel_size: int = 1      # DeepSpeed-Ulysses SP ranks per replica (--ds-sequence-parallel-size)
    fp32_residual_connection: bool = False  # the residual stream (the norms' inputs) in fp32
    softmax_in_fp32: bool = True         # the math attention's softmax in fp32, else in the activation dtype

    @classmethod
    def from_args(cls, args: Namespace, fused_adam: bool = False) -> "TrainingSetup":
        config = getattr(args, "deepspeed_config_dict", None) or {}
        zero = config.get("zero_optimization", {})
        stage = args.zero_stage if args.zero_stage is not None else zero.get("stage", 0)
        precision = "fp16" if args.fp16 else ("bf16" if args.bf16 else "fp32")
        gbs = args.global_batch_size or args.micro_batch_size * args.data_parallel_size
        return cls(precision=precision, zero_stage=stage, data_parallel_size=args.data_parallel_size,
                   micro_batch_size=args.micro_batch_size,
                   num_micro_batches=gbs // (args.micro_batch_size * args.data_parallel_size),
                   pipeline=not args.no_pipeline_parallel, optimizer=args.optimizer,
                   sgd_momentum=args.sgd_momentum, fused_adam=fused_adam,
                   checkpoint_activations=args.checkpoint_activations,
                   checkpoint_num_layers=args.checkpoint_num_layers,
                   checkpoint_method=getattr(args, "activations_checkpoint_method", None) or "uniform",
                   attention_impl=args.attention_impl, hidden_dropout=args.hidden_dropout,
                   attention_dropout=args.attention_dropout,
                   reduce_bucket_size=int(zero.get("reduce_bucket_size", REDUCE_BUCKET_SIZE)),
                   overlap_comm=bool(zero.get("overlap_comm", stage == 3)),
                   sub_group_size=int(zero.get("sub_group_size", SUB_GROUP_SIZE)),
                   param_persistence_threshold=int(zero.get("stage3_param_persistence_threshold",
                                                            PERSISTENCE_THRESHOLD)),
                   grad_accum_dtype=(config.get("data_types") or {}).get("grad_accum_dtype")
                   or ("fp32" if getattr(args, "accumulate_allreduce_grads_in_fp32", False) else None),
                   moe=args.model_shape.is_moe, sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
                   sequence_parallel_size=getattr(args, "ds_sequence_parallel_size", 1),
                   fp32_residual_connection=getattr(args, "fp32_residual_connection", False),
                   softmax_in_fp32=softmax_in_fp32(args))

    @property
    def model_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]

    @property
    def weight_holders(self) -> int:
        """The ranks that hold the same weights (DP x SP): DeepSpeed reduces gradients and
        partitions ZeRO state over them."""
        return self.data_parallel_size * self.sequence_parallel_size

    def optimizer_wrapper(self) -> str:
        """The optimizer DeepSpeed's engine builds around ours (see the module docstring)."""
        if self.zero_stage == 3:
            return "zero3"
        if self.zero_stage == 1 and self.precision == "bf16" and self.grad_accum_dtype == "fp32":
            return "bf16"  # DeepSpeed's choice for fp32 accumulation of bf16 gradients at stage 1
        if self.zero_stage in (1, 2):
            return "zero"
        if self.precision == "fp32":
            return "torch"
        if self.precision == "bf16" and self.pipeline:
            return "bf16"
        return "fp16_fused" if self.fused_adam else "fp16_unfused"


class HeldParameter(NamedTuple):
    numel: int       # elements on this TP rank
    matrix: bool     # ndim > 1: the weight-decay group (megatron/training/optimizer.py)
    has_grad: bool   # the last stage's copy of the position table never gets a gradient


class RankMemory(NamedTuple):
    stage: int
    dp_rank: int
    weights: int
    gradients: int
    optimizer: int
    activations: int             # peak, all micro-batches in flight
    activations_per_micro_batch: int
    in_flight: int               # micro-batches whose activations a stage holds at once
    transient: int               # extra bytes during backward / step (not in total)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


def held_parameters(shape: ModelShape, stage: int, pipeline: bool = True) -> list[HeldParameter]:
    """This stage's parameters in `model.parameters()` order, per TP rank (every TP rank holds the
    same sizes). DeepSpeed's PipelineModule registers its tied modules first, so on the last of
    several stages the embedding copy comes before the transformer layers."""
    tp, pp = shape.tensor_model_parallel_size, shape.pipeline_model_parallel_size
    tied_layer = shape.num_layers + 2
    held = stage_parameters(shape, stage)
    if pipeline and pp > 1 and stage == pp - 1:
        held = [h for h in held if h[0].layer == tied_layer] + [h for h in held if h[0].layer != tied_layer]
    return [HeldParameter(spec.local_numel(tp), len(spec.shape) > 1,
                          not (spec.layer == tied_layer and spec.component == "position_embeddings"))
            for spec, _ in held]


def param_groups(params: Sequence[HeldParameter]) -> list[list[HeldParameter]]:
    """The optimizer's param groups as megatron/training/optimizer.py builds them; empty ones are dropped."""
    return [g for g in ([p for p in params if p.matrix], [p for p in params if not p.matrix]) if g]


def _aligned(numel: int, dp: int) -> int:
    alignment = 2 * dp  # DeepSpeed's nccl_start_alignment_factor x DP size
    return ceil(numel / alignment) * alignment


def _in_partition(group: Iterable[HeldParameter], partition_size: int, dp_rank: int) -> list[HeldParameter]:
    """Parameters overlapping DP rank `dp_rank`'s slice (DeepSpeed's `get_partition_info`)."""
    start, end = partition_size * dp_rank, partition_size * (dp_rank + 1)
    held, offset = [], 0
    for p in group:
        if start <= offset < end or offset < start < offset + p.numel:
            held.append(p)
        offset += p.numel
    return held


def _state_bytes(setup: TrainingSetup, numel: int, per_tensor_step: bool = True) -> int:
    """Optimizer state of `numel` fp32 elements held as one tensor."""
    if setup.optimizer == "sgd":
        return numel * MASTER_BYTES if setup.sgd_momentum > 0 else 0
    return 2 * numel * MASTER_BYTES + (STEP_BYTES if per_tensor_step else 0)


def model_state_bytes(params: Sequence[HeldParameter], setup: TrainingSetup,
                      dp_rank: int = 0) -> tuple[int, int, int, int]:
    """(weights, gradients, optimizer, transient) bytes of one rank holding `params`."""
    b, dp = setup.model_bytes, setup.weight_holders
    wrapper = setup.optimizer_wrapper()
    # fp32 without ZeRO: DeepSpeed's bucketed all-reduce runs unless megatron/training/pretrain.py skips it
    # (a dense model at DP = 1); it gives a parameter without a gradient a zero one, and flattens
    reduces = wrapper == "torch" and (dp > 1 or setup.moe)
    with_grad = params if reduces else [p for p in params if p.has_grad]
    full_grads = sum(p.numel for p in with_grad) * b
    step = not setup.fused_adam  # FusedAdam keeps `step` in the param group, not per tensor
    if wrapper == "torch":
        grads_flat_copy = full_grads if reduces else 0
        return (sum(p.numel for p in params) * b, full_grads,
                sum(_state_bytes(setup, p.numel, step) for p in with_grad), grads_flat_copy)
    if wrapper == "fp16_unfused":
        # fp32 copy per parameter; every copy gets a gradient (zeros if none), hence Adam state
        numel = sum(p.numel for p in params)
        return (numel * b, full_grads,
                numel * MASTER_BYTES + sum(_state_bytes(setup, p.numel, step) for p in params),
                numel * MASTER_BYTES)
    groups = param_groups(params)
    if wrapper == "fp16_fused":  # flat fp16 and fp32 copies per group, no padding
        numel = sum(p.numel for p in params)
        return (numel * b, full_grads,
                numel * MASTER_BYTES + sum(_state_bytes(setup, sum(p.numel for p in g), False) for g in groups),
                numel * MASTER_BYTES)
    if wrapper == "zero3":
        return _zero3_bytes(groups, setup)
    weights = grads = optimizer = 0
    acc_bytes = DTYPE_BYTES[setup.grad_accum_dtype] if setup.grad_accum_dtype in DTYPE_BYTES else b
    for group in groups:
        flat = _aligned(sum(p.numel for p in group), dp)
        partition = flat // dp
        weights += flat * b
        optimizer += partition * MASTER_BYTES + _state_bytes(setup, partition)
        if wrapper == "bf16":
            grads += flat * acc_bytes  # BF16_Optimizer's full flat gradient accumulator
        elif acc_bytes != b:
            # ZeRO 1/2 accumulating in another dtype (fp32): one flat buffer of the rank's
            # partition in that dtype (its compact grad partition buffer), no whole parameters
            grads += partition * acc_bytes
        else:
            # ZeRO 1/2 contiguous gradients: whole parameters overlapping the slice; a parameter
            # in the slice without a gradient gets an extra zeros_like (get_all_grad_tensors)
            mine = _in_partition(group, partition, dp_rank)
            grads += sum(p.numel for p in mine) * b + sum(p.numel for p in mine if not p.has_grad) * b
    if wrapper == "bf16":
        return weights, grads + full_grads, optimizer, 0  # bf16 .grad still set when step() starts
    bucket = setup.reduce_bucket_size * b * (2 if setup.overlap_comm else 1)
    return weights, grads, optimizer, bucket + (full_grads if setup.zero_stage == 1 else 0)


def _zero3_bytes(groups: Sequence[Sequence[HeldParameter]], setup: TrainingSetup) -> tuple[int, int, int, int]:
    """ZeRO 3 (DeepSpeedZeroOptimizer_Stage3): every parameter partitioned on its own, its
    ceil(numel / DP) elements per rank (`ds_tensor`), gradients likewise. A parameter of at most
    stage3_param_persistence_threshold elements stays gathered after its first use, a whole copy
    besides its partition -- except at DP 1, where DeepSpeed gathers nothing and the parameter is a
    view of its partition. Each param group's partitions are cut into sub groups of whole
    parameters, closed once they reach sub_group_size elements; each sub group has an fp32 master
    copy (also for fp32 weights: DeepSpeed clones them) and its own Adam state and step."""
    b, dp = setup.model_bytes, setup.weight_holders
    partitioned = gathered = optimizer = 0
    for group in groups:
        parts = [ceil(p.numel / dp) for p in group]
        partitioned += sum(parts)
        if dp > 1:
            gathered += sum(p.numel for p in group if p.numel <= setup.param_persistence_threshold)
        optimizer += sum(parts) * MASTER_BYTES + sum(_state_bytes(setup, n) for n in _sub_groups(parts, setup))
    return (partitioned + gathered) * b, partitioned * b, optimizer, setup.reduce_bucket_size * b


def _sub_groups(parts: list[int], setup: TrainingSetup) -> list[int]:
    """The element counts of one param group's sub groups (DeepSpeed's _create_fp16_sub_groups;
    a group of at most sub_group_size elements is one sub group, as the loop gives)."""
    sizes, current = [], 0
    for i, n in enumerate(parts):
        current += n
        if current >= setup.sub_group_size or i == len(parts) - 1:
            sizes.append(current)
            current = 0
    return sizes


# --- activations (estimate) ------------------------------------------------------------------

def sequence_shards(shape: ModelShape, setup: TrainingSetup) -> int:
    """Into how many parts sequence parallelism cuts the activations outside the TP linears: the
    norms' inputs and outputs (the column-parallel linears save their input shard and gather it
    again in backward), their statistics, the dropout masks and checkpointed layer inputs."""
    return shape.tensor_model_parallel_size if setup.sequence_parallel else 1


def layer_activation_bytes(shape: ModelShape, setup: TrainingSetup, b: int) -> int:
    """Bytes one transformer layer saves for backward for a micro-batch of `b` sequences on one
    TP rank. Korthikanti et al. count s b h (34 + 5 a s / h) at 2 bytes and TP=1; for our layer:
    LayerNorm inputs and outputs 4 sbh, QKV output 3sbh/t (q, k, v are views of it), attention
    output sbh/t (the dense layer's input is a view of it), h->4h output and GeLU output 2sbf/t,
    plus fp32 LayerNorm statistics. Under sequence parallelism the LayerNorm items and the
    residual dropout masks are per sequence shard: / t (Korthikanti et al.'s 34/t). sdpa (flash
    kernel) keeps a logsumexp instead of the s x s
    probabilities. The "math" implementation keeps the fp32 softmax, its copy in the activation
    dtype (or the dropout output) and a contiguous copy of the context; dropout keeps 1-byte masks
    (CUDA's fused dropout; on CPU torch keeps a mask in the activation dtype instead).
    DeepSpeed-Ulysses: everything per token counts this rank's s/SP tokens; the attention core sees
    all s positions of a/SP heads (the same logsumexp bytes, 1/SP of the s x s probabilities), and
    keeps its own output, which the dense layer's input (the all-to-all's result) no longer views."""
    ulysses = setup.sequence_parallel_size
    s_all, h, f = shape.seq_length, shape.hidden_size, shape.ffn_hidden_size
    s = s_all // ulysses  # this rank's tokens
    t, a = shape.tensor_model_parallel_size, shape.num_attention_heads // shape.tensor_model_parallel_size
    act = setup.model_bytes
    sb = s * b
    shards = sequence_shards(shape, setup)  # Megatron sequence parallelism
    # LayerNorm inputs and outputs (per shard under SP), QKV + context, h->4h + GeLU; mean/rstd fp32
    total = act * sb * (4 * h // shards + 4 * h // t + 2 * f // t) + 4 * 4 * sb // shards
    if setup.attention_impl == "sdpa":
        total += 4 * b * a * s  # logsumexp; flash attention's dropout keeps an RNG state, no mask
    else:
        dropout = setup.attention_dropout > 0
        if setup.softmax_in_fp32 or act == 4:  # fp32 probabilities, their copy in the activation dtype
            probs = 4 + (act if act != 4 or dropout else 0)
        else:  # the softmax in the activation dtype (--no-query-key-layer-scaling): its output, the dropout's
            probs = act + (act if dropout else 0)
        total += b * (a // ulysses) * s_all * s_all * (probs + (1 if dropout else 0))
        total += act * sb * h // t  # the context's contiguous re-layout
    if ulysses > 1:
        total += act * sb * h // t  # the core's output, before the all-to-all back
    if setup.hidden_dropout > 0:
        total += 2 * sb * h // shards  # bool masks of the two residual dropouts
    if setup.fp32_residual_connection:  # the two norms' inputs are the fp32 residual stream
        total += (4 - act) * 2 * sb * h // shards
    return total


def _embedding_activation_bytes(shape: ModelShape, setup: TrainingSetup, b: int) -> int:
    s, t = shape.seq_length // setup.sequence_parallel_size, shape.tensor_model_parallel_size
    total = 8 * b * s + 8 * s  # token ids (TP>1: the local ids) and position ids for the lookups
    if t > 1:
        total += b * s  # the out-of-slice mask
    if setup.hidden_dropout > 0:
        total += b * s * shape.hidden_size // sequence_shards(shape, setup)  # the dropout mask
    return total


def _head_activation_bytes(shape: ModelShape, setup: TrainingSetup, b: int) -> int:
    """Final LayerNorm, logits and the vocab-parallel cross entropy (fp32 softmax). DeepSpeed-Ulysses:
    this rank's s/SP tokens, but the loss mask is the whole sequences' (the loss is gathered)."""
    s, h, t = shape.seq_length // setup.sequence_parallel_size, shape.hidden_size, shape.tensor_model_parallel_size
    sb = s * b
    shards = sequence_shards(shape, setup)  # the logits' linear saves the norm's output shard
    norm_input = 4 if setup.fp32_residual_connection else setup.model_bytes  # the residual stream
    return (((norm_input + setup.model_bytes) * sb * h + 2 * 4 * sb) // shards  # LayerNorm input and output, stats
            + 4 * sb * shape.padded_vocab_size // t          # softmax
            + sb * (1 + 8) + 4 * shape.seq_length * b + 4)   # outside mask, local ids; loss mask, count


def activation_bytes(shape: ModelShape, setup: TrainingSetup, stage: int) -> tuple[int, int, int]:
    """(peak, per micro-batch, in flight) for one rank of `stage`. DeepSpeed's 1F1B schedule keeps
    min(PP - stage, micro-batches) micro-batches between forward and backward on a stage.
    With checkpointing a micro-batch keeps each chunk's input; in its backward the last stage's
    head is freed first, then one chunk is recomputed (its first LayerNorm input is the chunk's
    saved input, so that is not counted twice). The block method keeps the inputs of the stage's first
    k layers and everything of the others; its backward recomputes one of the k layers once the
    others' activations are freed."""
    pp = shape.pipeline_model_parallel_size
    b = setup.micro_batch_size
    layers = layers_per_stage(shape)[stage]
    embedding = _embedding_activation_bytes(shape, setup, b) if stage == 0 else 0
    head = _head_activation_bytes(shape, setup, b) if stage == pp - 1 else 0
    per_layer = layer_activation_bytes(shape, setup, b)
    in_flight = min(pp - stage, setup.num_micro_batches) if setup.pipeline else 1
    if not setup.checkpoint_activations or layers == 0:  # a stage of only the head recomputes nothing
        per_micro_batch = layers * per_layer + embedding + head
        return in_flight * per_micro_batch, per_micro_batch, in_flight
    k = min(setup.checkpoint_num_layers, layers)
    # a chunk's input: this rank's tokens (Ulysses: s/SP), sharded by Megatron sequence parallelism
    chunk_input = (setup.model_bytes * (shape.seq_length // setup.sequence_parallel_size) * b * shape.hidden_size
                   // sequence_shards(shape, setup))
    if setup.checkpoint_method == "block":
        per_micro_batch = k * chunk_input + (layers - k) * per_layer + embedding + head
        in_backward = k * chunk_input + embedding + (per_layer - chunk_input if k else 0)
        return (in_flight - 1) * per_micro_batch + max(per_micro_batch, in_backward), per_micro_batch, in_flight
    per_micro_batch = ceil(layers / k) * chunk_input + embedding + head
    in_backward = per_micro_batch - head + k * per_layer - chunk_input
    return (in_flight - 1) * per_micro_batch + max(per_micro_batch, in_backward), per_micro_batch, in_flight


# --- all ranks -------------------------------------------------------------------------------

def predict_memory(shape: ModelShape, setup: TrainingSetup) -> list[RankMemory]:
    """RankMemory for every (stage, DP rank); every TP rank of a stage holds the same sizes."""
    ranks = []
    for stage in range(shape.pipeline_model_parallel_size):
        params = held_parameters(shape, stage, setup.pipeline)
        peak, per_mb, in_flight = activation_bytes(shape, setup, stage)
        for dp_rank in range(setup.weight_holders):
            weights, grads, optimizer, transient = model_state_bytes(params, setup, dp_rank)
            ranks.append(RankMemory(stage, dp_rank, weights, grads, optimizer, peak, per_mb, in_flight, transient))
    return ranks


def most_loaded(ranks: Iterable[RankMemory]) -> RankMemory:
    return max(ranks, key=lambda r: (r.total, r.transient))


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _sp_note(setup: TrainingSetup) -> str:
    """DeepSpeed-Ulysses: the SP size, and that the dp rank column is the rank among DP x SP."""
    sp = setup.sequence_parallel_size
    return f" x SP={sp} (ZeRO over {setup.weight_holders} ranks)" if sp > 1 else ""


def _checkpointing_note(setup: TrainingSetup) -> str:
    if not setup.checkpoint_activations:
        return ""
    if setup.checkpoint_method == "block":
        return f", checkpointed activations (block: first {setup.checkpoint_num_layers} layer(s) of each stage)"
    return ", checkpointed activations"


def format_memory_report(shape: ModelShape, setup: TrainingSetup,
                         ranks: list[RankMemory] | None = None) -> list[str]:
    """One table, per stage its most loaded DP rank, bytes exact except activations."""
    ranks = ranks or predict_memory(shape, setup)
    lines = [f"memory per rank (predicted; {setup.precision}, ZeRO {setup.zero_stage}, "
             f"{WRAPPER_NAMES[setup.optimizer_wrapper()]}, DP={setup.data_parallel_size}{_sp_note(setup)}, micro batch "
             f"{setup.micro_batch_size} x {setup.num_micro_batches}"
             f"{_checkpointing_note(setup)}{', sequence parallel' if setup.sequence_parallel else ''}):",
             "  stage | dp rank |         weights |       gradients |       optimizer |    activations* |"
             "           total"]
    for stage in range(shape.pipeline_model_parallel_size):
        r = most_loaded([r for r in ranks if r.stage == stage])
        lines.append(f"  {stage:5d} | {r.dp_rank:7d} | {r.weights:15,} | {r.gradients:15,} | {r.optimizer:15,} | "
                     f"{r.activations:15,} | {r.total:15,}")
    top = most_loaded(ranks)
    lines.append(f"  most loaded rank (stage {top.stage}, DP rank {top.dp_rank}): {format_bytes(top.total)}; "
                 f"*activations estimated: {top.in_flight} micro-batch(es) in flight x "
                 f"{format_bytes(top.activations_per_micro_batch)}{MOE_ACTIVATIONS_NOTE if setup.moe else ''}")
    if setup.moe and setup.zero_stage > 0:
        lines.append(f"  estimate: with ZeRO {setup.zero_stage} DeepSpeed partitions the expert parameter groups over "
                     f"the expert-data-parallel group, which this table does not model")
    if top.transient:
        lines.append(f"  plus up to {format_bytes(top.transient)} transient during backward / step "
                     f"(reduce buckets, unreduced or fp32 gradient copies; not in the total)")
    return lines
