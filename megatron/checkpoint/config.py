"""The checkpoint section of the run configuration: every flag checkpointing reads, and the model
shape, parallel layout, precision, ZeRO stage and resume plan the checkpoints it writes and reads
are checked against, as one frozen value built once (RunConfig.checkpoint). CheckpointManager reads
nothing else, so checkpoint/ imports nothing of megatron/config/. Torch-free, like megatron/config/run_config.py:
tools validate flags without torch."""
import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from megatron.metrics.memory import TrainingSetup
from megatron.model.shape import ModelShape
from megatron.runtime.parallel_layout import ParallelLayout
from megatron.runtime.precision import Precision


@dataclass(frozen=True)
class ResumePlan:
    """What --load found before the model was built (megatron/checkpoint/resume.py)."""
    universal_tag: str | None = None                 # --universal-checkpoint: the converted folder's tag
    reshard_source: tuple[str, int] | None = None    # (load dir, iteration) saved at another layout
    make_vocab_size_divisible_by: int | None = None  # the divisor that keeps the saved padded vocab


@dataclass(frozen=True)
class CheckpointConfig:
    save: str | None                  # --save DIR
    load: str | None                  # --load DIR
    save_interval: int | None
    no_save_rng: bool
    no_load_optim: bool
    no_load_rng: bool
    finetune: bool                    # load the weights only: counters, optimizer and schedule restart
    universal_checkpoint: bool        # --load names DeepSpeed's ds_to_universal.py output
    # the optimizer DeepSpeed builds around ours (megatron/memory.py's names): which saved optimizer
    # states can be resharded into it
    optimizer_wrapper: str
    # numerics and tokenizer files (absolute paths) written to megatron_model.json for tools, in
    # the file's key order; the vocab, its divisor and the sequence length come from the shape
    model_info: Mapping[str, Any]
    # what a saved checkpoint is written at and checked against (the run's own sections, shared)
    model_shape: ModelShape
    parallel: ParallelLayout
    precision: Precision
    zero_stage: int
    seq_length: int
    memory: TrainingSetup  # what the memory table predicts for: the bytes a checkpoint of this run takes
    resume: ResumePlan = ResumePlan()  # what --load found before the model was built
    exit_on_missing_checkpoint: bool = False  # --load holding no checkpoint stops the run (exit 2)

    @property
    def load_optimizer(self) -> bool:
        return not (self.no_load_optim or self.finetune)

    @classmethod
    def from_args(cls, args: argparse.Namespace, parallel: ParallelLayout, shape: ModelShape | None = None,
                  resume: ResumePlan | None = None) -> "CheckpointConfig":
        """`shape`: args.model_shape unless given (initialize_megatron plans the resume with the
        shape the tokenizer completed, before it is stored on args)."""
        def path(p: str | None) -> str | None:
            return os.path.abspath(p) if p else None
        info = {"layernorm_epsilon": args.layernorm_epsilon, "rope_theta": args.rope_theta,
                "hidden_dropout": args.hidden_dropout, "attention_dropout": args.attention_dropout,
                "init_method_std": args.init_method_std,
                "params_dtype": str(args.params_dtype).replace("torch.", ""),
                "tokenizer_type": args.tokenizer_type or ("GPT2BPETokenizer" if args.vocab_file and args.merge_file
                                                          else "NullTokenizer"),
                "vocab_file": path(args.vocab_file), "merge_file": path(args.merge_file),
                "tokenizer_name_or_path": path(getattr(args, "tokenizer_name_or_path", None)),
                "tokenizer_model": path(getattr(args, "tokenizer_model", None))}
        memory = TrainingSetup.from_args(args)
        return cls(save=args.save, load=args.load, save_interval=args.save_interval, no_save_rng=args.no_save_rng,
                   no_load_optim=args.no_load_optim, no_load_rng=args.no_load_rng, finetune=args.finetune,
                   universal_checkpoint=args.universal_checkpoint,
                   optimizer_wrapper=memory.optimizer_wrapper(),
                   model_info=MappingProxyType(info), model_shape=shape or args.model_shape, parallel=parallel,
                   precision=Precision.from_args(args), zero_stage=args.zero_stage, seq_length=args.seq_length,
                   memory=memory, resume=resume or ResumePlan(),
                   exit_on_missing_checkpoint=getattr(args, "exit_on_missing_checkpoint", False))
