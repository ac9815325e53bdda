"""Save / resume through the DeepSpeed engine, plus our client state.

Layout of --save DIR:
  DIR/global_stepN/...                     DeepSpeed's files for iteration N
  DIR/global_stepN/megatron_layout.json    the model shape and TP/PP layout it was saved with
  DIR/latest, DIR/latest_checkpointed_iteration.txt
The two pointers are written (atomically) only after every rank has finished writing
global_stepN, so a crash mid-save leaves the previous checkpoint as the one that loads.
"""
import contextlib
import json
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from megatron import mpu, print_rank_0
from megatron.arguments import ConfigError
from megatron.checkpoint_reshard import LAYOUT_FILE as LAYOUT
from megatron.checkpoint_reshard import TRACKER, optimizer_param_names, saved_split, write_model_info
from megatron.model.partition import DEFAULT_METHOD
from megatron.universal_checkpoint import attach_universal_checkpoint_info
from megatron.model.shape import gpt2_variant
from megatron.training_state import saved_progress

# what must match for the saved tensors to fit the model being built
LAYOUT_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "padded_vocab_size",
               "max_position_embeddings", "tensor_model_parallel_size", "pipeline_model_parallel_size",
               "ds_pipeline_enabled")


def _tag(iteration):
    return f"global_step{iteration}"


# an MoE model's files also depend on how its experts are laid out (one file per expert and TP rank)
MOE_LAYOUT_KEYS = ("num_experts", "expert_interval", "topk", "mlp_type", "moe_expert_parallel_size",
                   "enable_expert_tensor_parallelism")


def _layout(args):
    # plus the architecture variant (positions, GLU, norm, kv heads, head dim, tying, biases) and,
    # for an MoE model only (dense checkpoints are unchanged), its experts
    keys = LAYOUT_KEYS + (MOE_LAYOUT_KEYS if args.model_shape.is_moe else ())
    return {**{key: getattr(args, key) for key in keys}, **args.model_shape.variant(), **_split(args)}


def _split(args):
    """Which stage holds which layer (--pp-partition-method) decides the files of a pipeline
    checkpoint; recorded where it matters (PP > 1 on the pipeline engine)."""
    pipeline = args.ds_pipeline_enabled and args.pipeline_model_parallel_size > 1
    return {"pp_partition_method": args.model_shape.pp_partition_method or DEFAULT_METHOD} if pipeline else {}


def _write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _rng_state():
    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": mpu.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    mpu.get_cuda_rng_tracker().set_states(state["tracker"])


def save_checkpoint(engine, lr_scheduler, progress, args):
    iteration = progress.iteration
    client_state = {
        "iteration": iteration,  # also inside progress; kept at the top for tools that read it
        "progress": progress.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "layout": _layout(args),
        "optimizer_param_names": optimizer_param_names(engine),  # lets another layout resume the optimizer
    }
    if not args.no_save_rng:
        client_state["rng_state"] = _rng_state()
    attach_universal_checkpoint_info(engine, args)  # so that DeepSpeed's ds_to_universal.py converts it
    with _moe_writers(engine, args):
        engine.save_checkpoint(args.save, tag=_tag(iteration), client_state=client_state, save_latest=False)
    dist.barrier()  # every rank's shards are on disk before the pointers move
    if args.rank == 0:
        _write_atomic(os.path.join(args.save, _tag(iteration), LAYOUT), json.dumps(_layout(args), indent=1))
        write_model_info(os.path.join(args.save, _tag(iteration)), args)
        _write_atomic(os.path.join(args.save, "latest"), _tag(iteration))
        _write_atomic(os.path.join(args.save, TRACKER), str(iteration))
    dist.barrier()
    progress.last_saved_iteration = iteration
    print_rank_0(f"saved checkpoint at iteration {iteration} to {args.save}")


def _moe_writers(engine, args):
    if not args.model_shape.is_moe:
        return contextlib.nullcontext()
    from megatron.model.moe import every_tp_rank_writes_its_files
    return every_tp_rank_writes_its_files(engine)


def read_tracker(load_dir):
    path = os.path.join(load_dir, TRACKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ConfigError(f"--load {load_dir}: {TRACKER} holds '{text}', not an iteration number")
    return int(text)


def check_layout(load_dir, iteration, args):
    path = os.path.join(load_dir, _tag(iteration), LAYOUT)
    if not os.path.isfile(path):
        raise ConfigError(f"--load {load_dir}: {path} is missing; the checkpoint was not written by this trainer")
    with open(path) as f:
        saved = json.load(f)
    # a checkpoint written before architecture variants existed is a GPT-2
    saved = saved_split({**gpt2_variant(saved["num_attention_heads"], saved["hidden_size"]), **saved})
    # another shape or precision fails here; another TP x PP x DP layout, pipeline split or ZeRO stage
    # is resharded on load
    from megatron.resume_reshard import plan_reshard
    return plan_reshard(load_dir, iteration, saved, _layout(args), args)


def check_load_layout(args):
    if args.universal_checkpoint:
        from megatron.resume_reshard import plan_universal
        return plan_universal(args, _layout(args))
    iteration = read_tracker(args.load)
    if iteration is not None:
        return check_layout(args.load, iteration, args)


def load_checkpoint(engine, lr_scheduler, progress, args):
    """Restores the weights (and optimizer, LR schedule and `progress` unless --finetune) and
    returns the saved RNG state or None. The caller restores the RNG state once everything that
    draws from the RNG during setup has run."""
    iteration = None if args.universal_checkpoint else read_tracker(args.load)
    if args.universal_checkpoint:  # DeepSpeed cuts TP slices and DP partitions from DIR/<tag>/zero
        path, client_state = engine.load_checkpoint(args.load, tag=args.run_config.resume.universal_tag,
                                                    load_lr_scheduler_states=False,
                                                    load_optimizer_states=not args.no_load_optim and not args.finetune)
    elif iteration is None:
        print_rank_0(f"WARNING: no checkpoint found in --load {args.load}; starting from scratch")
        return None
    elif args.run_config.resume.reshard_source:  # saved at another TP x PP layout (see check_layout)
        from megatron.resume_reshard import load_resharded
        path, client_state = load_resharded(engine, args)
    else:
        path, client_state = engine.load_checkpoint(args.load, tag=_tag(iteration),
                                                    load_optimizer_states=not args.no_load_optim and not args.finetune,
                                                    load_lr_scheduler_states=False)
    if path is None:
        raise ConfigError(f"--load {args.load}: DeepSpeed could not load {_tag(iteration)}")
    if args.universal_checkpoint:
        client_state.pop("rng_state", None)  # another layout's: the run reseeds from --seed
    if args.finetune:
        print_rank_0(f"loaded weights from {path} (finetune: counters and optimizer reset)")
        return None
    saved = saved_progress(client_state)
    progress.load_state_dict(saved)
    if "consumed_train_tokens" not in saved:  # written before tokens were counted
        progress.consumed_train_tokens = progress.consumed_train_samples * args.seq_length
    progress.last_saved_iteration = progress.iteration
    lr_scheduler.load_state_dict(client_state["lr_scheduler"])
    print_rank_0(f"loaded checkpoint {path} at iteration {progress.iteration}")
    return None if args.no_load_rng else client_state.get("rng_state")
