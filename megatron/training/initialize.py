"""initialize_megatron: validated args, torch.distributed (gloo on CPU, nccl on CUDA), model-parallel
groups, tokenizer (then the --save directory's lock and room, and a --load checkpoint's fit),
seeds — in that order, so bad flags fail before any of the expensive steps; then the run
configuration is frozen (the TensorBoard writer belongs to the Trainer's metrics,
megatron/metrics/processor.py)."""
import dataclasses
import os
import random
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import torch

from megatron import mpu
from megatron.checkpoint.config import ResumePlan
from megatron.config.arguments import parse_args
from megatron.config.run_config import FrozenArgs, RunArgs, RunConfig, freeze_args
from megatron.config.validation import validate_args
from megatron.runtime.global_vars import set_args, set_tokenizer
from megatron.runtime.parallel_layout import ParallelLayout
from megatron.runtime.refusal import ConfigError


def initialize_megatron(extra_args_provider: Callable | None = None, args_list: list[str] | None = None) -> FrozenArgs:
    """Returns args, read-only from here on; the run's configuration as immutable values is
    args.run_config (megatron/config/run_config.py)."""
    args = validate_args(parse_args(extra_args_provider, args_list))
    layout = _initialize_distributed(args)
    _startup_lines(args)
    set_args(args)
    resume = _build_tokenizer(args, layout)
    _set_random_seed(args.seed)
    return freeze_args(args, RunConfig.from_args(args, layout, resume))


def disable_deepspeed_shm_comm() -> None:
    """On CPU, DeepSpeed all-reduces through a JIT-compiled shared-memory op whose buffers stay in
    /dev/shm after the run (gigabytes per run, until the machine runs out of memory). gloo's own
    all-reduce does the same job and leaves nothing behind."""
    from megatron.runtime.deepspeed_internals import disable_shm_comm_op
    disable_shm_comm_op()


def _initialize_distributed(args: RunArgs) -> ParallelLayout:
    """torch.distributed, then the parallel layout (the owner of the sizes from here on) and the
    process groups built from it."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from megatron.runtime.deepspeed_internals import check_deepspeed_version

    if not torch.cuda.is_available():
        disable_deepspeed_shm_comm()
    backend = args.distributed_backend or get_accelerator().communication_backend_name()
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    # --distributed-timeout-minutes: the default process group's timeout and our TP / PP / DP groups'
    timeout = timedelta(minutes=args.distributed_timeout_minutes)
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)
    check_deepspeed_version()  # one line on rank 0 outside the tested releases
    args.rank = torch.distributed.get_rank()
    assert torch.distributed.get_world_size() == args.world_size
    layout = ParallelLayout.from_args(args)
    mpu.initialize_model_parallel(layout.tensor_model_parallel_size, layout.pipeline_model_parallel_size,
                                  layout.sequence_parallel_size, timeout=timeout)
    assert mpu.get_data_parallel_world_size() == layout.data_parallel_size, "DeepSpeed's topology disagrees"
    if backend == "gloo" and args.shm_tp_all_reduce:
        from megatron import print_rank_0
        from megatron.mpu.shm_comm import enable_for_tensor_model_parallel
        print_rank_0(enable_for_tensor_model_parallel(mpu.get_tensor_model_parallel_group()))
    if args.deepspeed_activation_checkpointing:
        from megatron.mpu.random import configure_deepspeed_checkpointing
        configure_deepspeed_checkpointing(args, mpu)
    return layout


def _startup_lines(args):
    """Logger levels first (DeepSpeed logs from here on), then on rank 0 what validation had to say:
    the flags accepted with no effect, a --clip-grad that DeepSpeed's clipping overrides."""
    from megatron import print_rank_0
    from megatron.config.script_flags import no_effect_line
    from megatron.runtime.log_levels import apply_log_levels
    apply_log_levels(args, args.rank)
    for line in [no_effect_line(args)] + getattr(args, "startup_notes", []):
        if line:
            print_rank_0(line)


def _build_tokenizer(args, layout: ParallelLayout | None = None) -> ResumePlan:
    """The tokenizer, then the model's shape completed once: the tokenizer's vocab and (with
    a layout and --load) the vocab divisor that keeps a checkpoint's padded vocab. With a layout,
    the --save directory is locked and checked (CheckpointManager.open_save_dir); a directory this
    run cannot use or a checkpoint that does not fit fails here, before the model is built. Returns
    what --load will read."""
    from megatron.tokenizer import build_tokenizer
    try:
        tokenizer = build_tokenizer(args)
    except (ValueError, OSError) as e:  # unreadable or malformed --vocab-file / --merge-file
        raise ConfigError(str(e)) from None
    set_tokenizer(tokenizer)
    shape = dataclasses.replace(args.model_shape, vocab_size=tokenizer.vocab_size)
    # HFTokenizer sizes the vocab without the special tokens it adds (as Microsoft's fork does)
    if tokenizer.eod >= shape.padded_vocab_size:
        raise ConfigError(f"the tokenizer's end-of-document id {tokenizer.eod} is outside the padded vocab "
                          f"{shape.padded_vocab_size}: raise --pad-vocab-size-to / --make-vocab-size-divisible-by")
    resume = ResumePlan()
    if layout is not None and (args.save or args.load):
        from megatron.checkpoint.config import CheckpointConfig
        from megatron.checkpoint.manager import CheckpointManager
        # the checkpoint is checked against this run's completed shape
        manager = CheckpointManager(CheckpointConfig.from_args(args, layout, shape))
        # first the lock and room of --save: a directory this run cannot use stops it before the
        # --load checkpoint is read (and a crashed save's leftovers there are cleared before it is)
        manager.open_save_dir()
    if layout is not None and args.load:
        resume = manager.plan_resume()
        if resume.make_vocab_size_divisible_by is not None:
            shape = dataclasses.replace(shape, make_vocab_size_divisible_by=resume.make_vocab_size_divisible_by)
    args.model_shape = shape
    return resume


def _set_random_seed(seed):
    """Python / numpy get the plain seed; torch gets the TP/PP-aware seeds."""
    random.seed(seed)
    np.random.seed(seed)
    mpu.model_parallel_seed(seed)
