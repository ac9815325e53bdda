"""Save / resume through the DeepSpeed engine, plus our client state.

What --save DIR holds is described in megatron/checkpoint_layout.py. The trackers move
(atomically) only after every rank has finished writing global_stepN, so a crash mid-save
leaves the previous checkpoint as the one that loads.
"""
import contextlib
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from megatron import mpu, print_rank_0
from megatron.arguments import ConfigError
from megatron.checkpoint_layout import LAYOUT_FILE as LAYOUT  # noqa: F401  (tests import it from here)
from megatron.checkpoint_layout import (
    TRACKER,  # noqa: F401
    CheckpointLayout,
    read_layout,
    read_tracker,
    step_dir,
    step_tag,
    write_layout,
    write_model_info,
    write_tracker,
)
from megatron.checkpoint_reshard import optimizer_param_names
from megatron.training_state import saved_progress
from megatron.universal_checkpoint import attach_universal_checkpoint_info


def _layout(args: Any) -> CheckpointLayout:
    return CheckpointLayout.from_shape(args.model_shape, args.ds_pipeline_enabled)


def _rng_state():
    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": mpu.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    mpu.get_cuda_rng_tracker().set_states(state["tracker"])


def save_checkpoint(engine: Any, lr_scheduler: Any, progress: Any, args: Any) -> None:
    iteration, layout = progress.iteration, _layout(args)
    client_state = {
        "iteration": iteration,  # also inside progress; kept at the top for tools that read it
        "progress": progress.state_dict(),
        "lr_scheduler": lr_scheduler.state_dict(),
        "layout": layout.to_dict(),
        "optimizer_param_names": optimizer_param_names(engine),  # lets another layout resume the optimizer
    }
    if not args.no_save_rng:
        client_state["rng_state"] = _rng_state()
    attach_universal_checkpoint_info(engine, args)  # so that DeepSpeed's ds_to_universal.py converts it
    with _moe_writers(engine, args):
        engine.save_checkpoint(args.save, tag=step_tag(iteration), client_state=client_state, save_latest=False)
    dist.barrier()  # every rank's shards are on disk before the pointers move
    if args.rank == 0:
        write_layout(step_dir(args.save, iteration), layout)
        write_model_info(step_dir(args.save, iteration), args)
        write_tracker(args.save, iteration)
    dist.barrier()
    progress.last_saved_iteration = iteration
    print_rank_0(f"saved checkpoint at iteration {iteration} to {args.save}")


def _moe_writers(engine, args):
    if not args.model_shape.is_moe:
        return contextlib.nullcontext()
    from megatron.model.moe import every_tp_rank_writes_its_files
    return every_tp_rank_writes_its_files(engine)


def check_layout(load_dir: str, iteration: int, args: Any) -> None:
    # a checkpoint written before architecture variants existed reads as a GPT-2
    saved = read_layout(step_dir(load_dir, iteration), f"--load {load_dir}")
    # another shape or precision fails here; another TP x PP x DP layout, pipeline split or ZeRO stage
    # is resharded on load
    from megatron.resume_reshard import plan_reshard
    return plan_reshard(load_dir, iteration, saved, _layout(args), args)


def check_load_layout(args: Any) -> None:
    if args.universal_checkpoint:
        from megatron.resume_reshard import plan_universal
        return plan_universal(args, _layout(args))
    iteration = read_tracker(args.load, f"--load {args.load}")
    if iteration is not None:
        return check_layout(args.load, iteration, args)


def load_checkpoint(engine: Any, lr_scheduler: Any, progress: Any, args: Any) -> dict | None:
    """Restores the weights (and optimizer, LR schedule and `progress` unless --finetune) and
    returns the saved RNG state or None. The caller restores the RNG state once everything that
    draws from the RNG during setup has run."""
    iteration = None if args.universal_checkpoint else read_tracker(args.load, f"--load {args.load}")
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
        path, client_state = engine.load_checkpoint(args.load, tag=step_tag(iteration),
                                                    load_optimizer_states=not args.no_load_optim and not args.finetune,
                                                    load_lr_scheduler_states=False)
    if path is None:
        raise ConfigError(f"--load {args.load}: DeepSpeed could not load {step_tag(iteration)}")
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
