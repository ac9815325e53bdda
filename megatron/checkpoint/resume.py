"""Resume a checkpoint saved at one TP x PP x DP layout (and ZeRO stage) in a run at another, with
the same model shape and precision (automatic on --load; the pipeline and the
--no-pipeline-parallel engines mix too).

Each rank reads the saved shards of the layers it holds, merges them into full tensors and cuts
its own slice (reshard.py): the fp32 master weights (the weights themselves in plain fp32;
DeepSpeed's flat DP partitions with fp16 / bf16 / ZeRO, see zero_state.py), Adam's moments and
step. They go into this run's optimizer as it holds them: the torch optimizer's per-parameter
state, or DeepSpeed's flat partitions of this DP rank (megatron/runtime/deepspeed_internals.py), from
which the low-precision weights are refreshed.
Iteration, consumed samples (the data position), gigaflos and the LR schedule are layout-free
client state and carry over as they are. RNG states are per TP / PP rank and do not: the run
reseeds from --seed (dropout masks differ from the original layout's, as they would anyway).
"""
from typing import Any

import torch

from megatron import mpu, print_rank_0
from megatron.checkpoint.config import CheckpointConfig, ResumePlan
from megatron.checkpoint.layout import CheckpointLayout
from megatron.checkpoint.reshard import Checkpoint, saved_precision, table_key, tp_cut
from megatron.checkpoint.universal import check_universal_load
from megatron.checkpoint.zero_state import read_loss_scaler
from megatron.model.analytic import parameter_table
from megatron.model.shape import ModelShape, pad_vocab_size
from megatron.runtime.deepspeed_internals import (
    holds_flat_partitions,
    set_loss_scaler,
    set_progress_counters,
    write_flat_state,
)
from megatron.runtime.parallel_layout import ParallelLayout
from megatron.runtime.refusal import ConfigError
from megatron.schedules.progress import saved_progress


def _describe(parallel: ParallelLayout) -> str:
    engine = "" if parallel.ds_pipeline_enabled else ", no pipeline engine"
    return f"TP={parallel.tensor_model_parallel_size} x PP={parallel.pipeline_model_parallel_size}{engine}"


# optimizers DeepSpeed builds (megatron/metrics/memory.py's names) whose state cannot be put back at another layout
_UNSUPPORTED = {"zero3": "ZeRO stage 3 partitions the weights too",
                "fp16_fused": "DeepSpeed's FP16_Optimizer keeps flat fp32 copies without parameter names",
                "fp16_unfused": "DeepSpeed's FP16_Optimizer keeps flat fp32 copies without parameter names"}


def _check_shape(saved: CheckpointLayout, ours: CheckpointLayout, shape: ModelShape, where: str) -> None:
    """Another model shape (not layout) fails in one line naming what differs."""
    if saved == ours:
        return
    vocab = shape.vocab_size
    differ = [f"{k}: saved {then} vs now {now}" for k, then, now in saved.shape_differences(ours)]
    if vocab > saved.padded_vocab_size:
        differ.append(f"vocab: saved padded to {saved.padded_vocab_size} vs now {vocab} tokens")
    if differ:
        raise ConfigError(f"{where}: the checkpoint's model shape differs from this run's ({', '.join(differ)}); "
                          f"launch with the saved shape")


def _check_precision(saved: str, precision: str, where: str) -> None:
    if saved != precision:
        flag = "" if saved == "fp32" else f" (--{saved})"
        raise ConfigError(f"{where}: the checkpoint was saved in {saved}, this run trains in {precision}; "
                          f"launch with the saved precision{flag}")


def plan_universal(load_dir: str, ours: CheckpointLayout, shape: ModelShape, parallel: ParallelLayout,
                   precision: str, zero_stage: int) -> ResumePlan:
    """--universal-checkpoint, before the model is built: DeepSpeed's converted folder holds this
    model's shape in this precision; the padded vocab is kept as saved (DeepSpeed cuts TP slices
    of the saved tensors as they are). Returns the tag to load and the vocab divisor to keep."""
    where = f"--universal-checkpoint --load {load_dir}"
    tag, saved, config = check_universal_load(load_dir, shape, zero_stage)
    _check_shape(saved, ours, shape, where)
    _check_precision(saved_precision(config), precision, where)
    if saved.ds_pipeline_enabled != parallel.ds_pipeline_enabled:  # DeepSpeed finds parameters by module name
        engine = "the pipeline engine" if saved.ds_pipeline_enabled else "--no-pipeline-parallel"
        raise ConfigError(f"{where}: saved with {engine}, whose parameter names this engine does not have; resume "
                          f"with {engine}, or with --load alone (which switches engines)")
    divisor = _keep_padded_vocab(saved.padded_vocab_size, shape, where)
    print_rank_0(f"resuming DeepSpeed universal checkpoint {load_dir}/{tag} at {_describe(parallel)} x "
                 f"DP={parallel.data_parallel_size}")
    return ResumePlan(universal_tag=tag, make_vocab_size_divisible_by=divisor)


def plan_reshard(source: Checkpoint, ours: CheckpointLayout, config: CheckpointConfig, shape: ModelShape,
                 parallel: ParallelLayout, precision: str, zero_stage: int) -> ResumePlan:
    """Before the model is built, on every --load: nothing to do when the checkpoint fits this run
    as DeepSpeed saved it (same TP x PP layout and ZeRO stage and, for DP-partitioned optimizer
    state, the same DP size); otherwise a shape or precision mismatch, an unsupported optimizer or
    a missing / truncated shard fails here in one line, else the padded vocab is kept as saved and
    the plan names the source for load_resharded (RunConfig.resume)."""
    where = f"--load {source.load_dir}"
    saved = source.layout
    _check_shape(saved, ours, shape, where)
    if not saved.is_moe:  # every shard there and readable, also for DeepSpeed's own load (MoE: the manifest's job)
        source.check_readable()
    setup = source.saved_setup()
    _check_precision(setup["precision"], precision, where)
    with_optimizer = config.load_optimizer
    # DeepSpeed partitions ZeRO state over every rank holding the weights: DP x SP (Ulysses), the
    # dp_world_size it saves
    dp = parallel.data_parallel_size * parallel.sequence_parallel_size
    moved = []
    if setup["zero_stage"] != zero_stage and with_optimizer:
        moved.append(f"ZeRO stage {setup['zero_stage']} -> {zero_stage}")
    if setup["form"] == "flat" and setup["dp"] != dp and with_optimizer:
        moved.append(f"DP={setup['dp']} -> DP={dp}")
    if saved == ours and not moved:
        return ResumePlan()  # DeepSpeed's own load, exactly as saved
    now = f"{_describe(parallel)} x DP={dp}"
    if shape.is_moe:  # DeepSpeed writes experts per EP rank; resharding them is not built
        raise ConfigError(f"{where}: resuming a mixture-of-experts checkpoint ({source.describe()} x DP={setup['dp']}, "
                          f"ZeRO {setup['zero_stage']}) at {now}, ZeRO {zero_stage} is not supported; resume at "
                          f"the saved layout and ZeRO stage")
    wrapper = config.optimizer_wrapper
    if wrapper in _UNSUPPORTED:
        raise ConfigError(f"{where}: resuming a {source.describe()} checkpoint at {now} in {precision} with "
                          f"ZeRO stage {zero_stage} is not supported ({_UNSUPPORTED[wrapper]}); "
                          f"use --zero-stage 1, or resume at the saved layout")
    if with_optimizer:
        source.check_optimizer()
    divisor = _keep_padded_vocab(saved.padded_vocab_size, shape, where)
    change = f" ({', '.join(moved)})" if moved else ""
    print_rank_0(f"resuming {source.describe()} checkpoint {source.step_dir} at {_describe(parallel)}: "
                 f"resharding weights{' and optimizer state' if with_optimizer else ''}{change}")
    return ResumePlan(reshard_source=(source.load_dir, source.iteration), make_vocab_size_divisible_by=divisor)


def _keep_padded_vocab(saved: int, shape: ModelShape, where: str) -> int | None:
    """The padded rows are real logits (they enter the softmax), so the padded vocab must stay as
    saved: returns the --make-vocab-size-divisible-by that pads to it at this TP size (None: this
    run's already does); initialize_megatron puts it into the model's shape."""
    if shape.padded_vocab_size == saved:
        return None
    if shape.pad_vocab_size_to is not None:  # an explicit size is never overridden
        raise ConfigError(f"{where}: the checkpoint's vocab is padded to {saved}, this run's --pad-vocab-size-to is "
                          f"{shape.pad_vocab_size_to}; pass --pad-vocab-size-to {saved}")
    tp = shape.tensor_model_parallel_size
    divisor = next((m // tp for m in range(tp, saved + 1, tp)
                    if saved % m == 0 and pad_vocab_size(shape.vocab_size, m // tp, tp) == saved), None)
    if divisor is None:
        raise ConfigError(f"{where}: the checkpoint's padded vocab {saved} does not split over "
                          f"--tensor-model-parallel-size {tp}; use a TP size that divides {saved}")
    print_rank_0(f"vocabulary kept padded to {saved} as saved (--make-vocab-size-divisible-by {divisor} at TP={tp})")
    return divisor


def _cut(value, spec, tp, tp_rank):
    if torch.is_tensor(value) and value.dim() > 0:
        return tp_cut(value, spec, tp, tp_rank).clone(memory_format=torch.contiguous_format)
    return value.clone() if torch.is_tensor(value) else value


def load_resharded(engine: Any, source: Checkpoint, config: CheckpointConfig, shape: ModelShape, pipeline: bool,
                   fp16: bool) -> tuple[str, dict]:
    """Fills this rank's module and optimizer from the saved checkpoint of another layout;
    returns (path, client state) as engine.load_checkpoint does, without the RNG state."""
    tp, tp_rank = shape.tensor_model_parallel_size, mpu.get_tensor_model_parallel_rank()
    specs = {(s.layer, s.key): s for s in parameter_table(shape)}
    params = [(p, table_key(name, shape, pipeline)) for name, p in engine.module.named_parameters()]
    layers = {ident[0] for _, ident in params}
    with_optimizer = config.load_optimizer
    # the fp32 masters and Adam's state: a mixed-precision / ZeRO source keeps its masters in
    # DeepSpeed's flat partitions (read even without the optimizer: the weights are their copies);
    # a plain fp32 source's masters are its weights
    flat_source = source.saved_setup()["form"] == "flat"
    masters, states = source.read_masters_and_optimizer(layers) if with_optimizer or flat_source else ({}, {})
    full = source.read_weights(layers)
    for ident, tensor in full.items():
        if tuple(tensor.shape) != tuple(specs[ident].shape):
            raise ConfigError(f"{source.step_dir}: {ident} is {tuple(tensor.shape)}, this run builds "
                              f"{tuple(specs[ident].shape)}")
        masters.setdefault(ident, tensor)
    del full
    ident_of = {id(p): ident for p, ident in params}

    def local(p: torch.nn.Parameter) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
        """(fp32 master, Adam's moments, step) of this rank's slice of p."""
        ident = ident_of[id(p)]
        spec, saved = specs[ident], states.get(ident) or {}
        moments = {k: _cut(v, spec, tp, tp_rank) for k, v in saved.items() if k != "step"}
        return _cut(masters[ident].float(), spec, tp, tp_rank), moments, saved.get("step")

    with torch.no_grad():
        for p, _ in params:
            p.copy_(local(p)[0])
        if holds_flat_partitions(engine):
            write_flat_state(engine, local, with_optimizer)
            if fp16 and with_optimizer and flat_source:
                set_loss_scaler(engine, read_loss_scaler(source))
        elif with_optimizer:  # the torch optimizer updates the module's own fp32 parameters
            for group in engine.optimizer.param_groups:
                for p in group["params"]:
                    _, moments, step = local(p)
                    if moments:  # a parameter that never had a gradient (the last stage's position table copy)
                        engine.optimizer.state[p] = {**moments, "step": _cut(step, None, 1, 0)}
    client_state = source.client_state()
    # DeepSpeed's own counters, as engine.load_checkpoint sets them
    set_progress_counters(engine, client_state.get("global_steps", saved_progress(client_state)["iteration"]),
                          client_state.get("global_samples", engine.global_samples),
                          client_state.get("skipped_steps", 0))
    client_state.pop("rng_state", None)
    return source.step_dir, client_state
