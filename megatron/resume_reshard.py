"""Resume a checkpoint saved at TP=a x PP=b in a run at TP=c x PP=d of the same model shape
(automatic on --load; the pipeline and the --no-pipeline-parallel engines mix too).

Each rank reads the saved shards of the layers it holds, merges them into full tensors and cuts
its own slice (megatron/checkpoint_reshard.py): weights exactly, Adam's moments and step the same
way. Iteration, consumed samples (the data position), gigaflos and the LR schedule are layout-free
client state and carry over as they are. RNG states are per TP / PP rank and do not: the run
reseeds from --seed (dropout masks differ from the original layout's, as they would anyway).

Supported where the optimizer updates the module's own fp32 parameters: fp32 without ZeRO, the
trainer's default. fp16 / bf16 / ZeRO keep flat master copies: a clear error names the flags.
"""
import dataclasses

import torch

from megatron import mpu, print_rank_0
from megatron.checkpoint_reshard import PARALLEL_KEYS, Checkpoint, table_key, tp_cut
from megatron.model.analytic import parameter_table
from megatron.model.shape import ConfigError, pad_vocab_size
from megatron.training_state import saved_progress


def _describe(args):
    engine = "" if args.ds_pipeline_enabled else ", no pipeline engine"
    return f"TP={args.tensor_model_parallel_size} x PP={args.pipeline_model_parallel_size}{engine}"


def plan_reshard(load_dir, iteration, saved, ours, args):
    """Before the model is built, when the saved layout differs from this run's: a shape mismatch
    (both shapes named), an unsupported precision or a missing / truncated shard fails here; else
    the padded vocab is kept as saved and args.reshard_source is set for load_resharded."""
    where = f"--load {load_dir}"
    shape_keys = [k for k in dict.fromkeys(list(saved) + list(ours)) if k not in PARALLEL_KEYS]
    vocab = args.model_shape.vocab_size
    differ = [f"{k}: saved {saved.get(k)} vs now {ours.get(k)}" for k in shape_keys if saved.get(k) != ours.get(k)]
    if vocab > saved["padded_vocab_size"]:
        differ.append(f"vocab: saved padded to {saved['padded_vocab_size']} vs now {vocab} tokens")
    if differ:
        raise ConfigError(f"{where}: the checkpoint's model shape differs from this run's ({', '.join(differ)}); "
                          f"launch with the saved shape")
    source = Checkpoint(load_dir, iteration)
    if args.model_shape.is_moe:  # DeepSpeed writes experts per EP rank; resharding them is not built
        raise ConfigError(f"{where}: resuming a mixture-of-experts checkpoint ({source.describe()}) at "
                          f"{_describe(args)} is not supported; resume at the saved layout")
    precision = [flag for flag, on in (("--fp16", args.fp16), ("--bf16", args.bf16),
                                       (f"--zero-stage {args.zero_stage}", args.zero_stage != 0)) if on]
    if precision:
        raise ConfigError(f"{where}: resuming a {source.describe()} checkpoint at {_describe(args)} works in fp32 "
                          f"without ZeRO only (this run has {' '.join(precision)}); resume at the saved layout")
    source.check_readable()
    if not (args.no_load_optim or args.finetune):
        source.check_optimizer()
    _keep_padded_vocab(saved["padded_vocab_size"], args, where)
    args.reshard_source = (load_dir, iteration)
    print_rank_0(f"resuming {source.describe()} checkpoint {source.step_dir} at {_describe(args)}: "
                 f"resharding weights{'' if args.no_load_optim or args.finetune else ' and optimizer state'}")


def _keep_padded_vocab(saved, args, where):
    """The padded rows are real logits (they enter the softmax), so the padded vocab must stay as
    saved: pick the --make-vocab-size-divisible-by that pads to it at this TP size."""
    shape = args.model_shape
    if shape.padded_vocab_size == saved:
        return
    if shape.pad_vocab_size_to is not None:  # an explicit size is never overridden
        raise ConfigError(f"{where}: the checkpoint's vocab is padded to {saved}, this run's --pad-vocab-size-to is "
                          f"{shape.pad_vocab_size_to}; pass --pad-vocab-size-to {saved}")
    tp = shape.tensor_model_parallel_size
    divisor = next((m // tp for m in range(tp, saved + 1, tp)
                    if saved % m == 0 and pad_vocab_size(shape.vocab_size, m // tp, tp) == saved), None)
    if divisor is None:
        raise ConfigError(f"{where}: the checkpoint's padded vocab {saved} does not split over "
                          f"--tensor-model-parallel-size {tp}; use a TP size that divides {saved}")
    args.model_shape = dataclasses.replace(shape, make_vocab_size_divisible_by=divisor)
    args.make_vocab_size_divisible_by = divisor
    args.padded_vocab_size = saved
    print_rank_0(f"vocabulary kept padded to {saved} as saved (--make-vocab-size-divisible-by {divisor} at TP={tp})")


def _local(value, spec, tp, tp_rank):
    if torch.is_tensor(value) and value.dim() > 0:
        return tp_cut(value, spec, tp, tp_rank).clone(memory_format=torch.contiguous_format)
    return value.clone() if torch.is_tensor(value) else value


def load_resharded(engine, args):
    """Fills this rank's module and optimizer from the saved checkpoint of another layout;
    returns (path, client state) as engine.load_checkpoint does, without the RNG state."""
    load_dir, iteration = args.reshard_source
    source = Checkpoint(load_dir, iteration)
    shape = args.model_shape
    tp, tp_rank = shape.tensor_model_parallel_size, mpu.get_tensor_model_parallel_rank()
    specs = {(s.layer, s.key): s for s in parameter_table(shape)}
    params = [(p, table_key(name, shape, args.ds_pipeline_enabled)) for name, p in engine.module.named_parameters()]
    layers = {ident[0] for _, ident in params}
    full = source.read_weights(layers)
    with torch.no_grad():
        for p, ident in params:
            if tuple(full[ident].shape) != tuple(specs[ident].shape):
                raise ConfigError(f"{source.step_dir}: {ident} is {tuple(full[ident].shape)}, this run builds "
                                  f"{tuple(specs[ident].shape)}")
            p.copy_(tp_cut(full[ident], specs[ident], tp, tp_rank))
    del full
    if not (args.no_load_optim or args.finetune):
        states, _ = source.read_optimizer(layers)
        ident_of = {id(p): ident for p, ident in params}
        for group in engine.optimizer.param_groups:
            for p in group["params"]:
                ident = ident_of[id(p)]
                saved = states.get(ident)
                if saved:  # a parameter that never had a gradient (the last stage's position table copy) has none
                    engine.optimizer.state[p] = {k: _local(v, specs[ident], tp, tp_rank) for k, v in saved.items()}
    client_state = source.client_state()
    # DeepSpeed's own counters, as engine.load_checkpoint sets them
    engine.global_steps = client_state.get("global_steps", saved_progress(client_state)["iteration"])
    engine.global_samples = client_state.get("global_samples", engine.global_samples)
    engine.skipped_steps = client_state.get("skipped_steps", 0)
    client_state.pop("rng_state", None)
    return source.step_dir, client_state
