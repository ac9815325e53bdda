#!/usr/bin/env python
"""Exact parameter count, FLOPs and memory per rank of a GPT from Megatron flags, without building a model.

    python tools/param_count.py --num-layers 8 --hidden-size 512 --num-attention-heads 8 \
        --seq-length 1024 --vocab-size 50257 --tensor-model-parallel-size 2 \
        --num-gpus 8 --bf16 --zero-stage 1 --micro-batch-size 4 --global-batch-size 64

The flags, their defaults and the shape's validation are the trainer's own (megatron/config/arguments.py,
megatron/model/shape.py); the numbers come from the same analytic functions the trainer's
startup cross-check uses and are printed by the same report, which names the architecture variant
(--swiglu, --num-key-value-heads, --use-rotary-position-embeddings, ... as the trainer takes them).
The vocab: --vocab-size, a GPT-2 --vocab-file, or the trainer's --tokenizer-type PretrainedFromHF /
HFTokenizer / GPTSentencePieceTokenizer with its local files (read with tokenizers / sentencepiece).
No torch, no GPU; the trainer's other flags (--lr, --save, ...) are ignored, so a launch script's whole
flag list can be pasted in; flags the trainer does not know either are named in one line on stderr
(the numbers are for the model without them: such a flag may change it)."""
import argparse
import json
import os
import sys
from collections.abc import Sequence

from megatron.config import arguments, ds_config, fork_features, validation
from megatron.metrics.memory import TrainingSetup, format_memory_report
from megatron.metrics.split_comparison import split_comparison_lines
from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError, require
from megatron.tokenizer.external import PATH_FLAG, vocab_size_without_torch
from megatron.utils import format_parameter_report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    for add in (arguments._add_network_size_args, arguments._add_distributed_args, arguments._add_training_args,
                arguments._add_data_args, arguments._add_mixed_precision_args, arguments._add_zero_args,
                arguments._add_regularization_args, arguments._add_moe_args):
        add(p)
    p.add_argument("--world-size", "--num-gpus", dest="world_size", type=int, default=None,
                   help="ranks in the job (default TP x PP x SP: DP = 1); sets the memory table's data-parallel size")
    p.add_argument("--ds-sequence-parallel-size", type=int, default=1,
                   help="DeepSpeed-Ulysses SP ranks per replica: the memory table's activations and ZeRO partitions")
    fork_features.add_args(p)
    args, rest = p.parse_known_args(argv)
    args.ignored_flags = _unknown_to_the_trainer(rest)
    fork_features.map_recompute(args)  # --recompute-* = --checkpoint-activations: FLOPs and memory follow
    # the trainer's own checks (megatron/config/arguments.py, ModelShape), for the flags parsed here
    validation.validate_flag_values(args)
    if args.rampup_batch_size:
        validation.validate_rampup(args)
    external = args.tokenizer_type in PATH_FLAG
    require((args.vocab_size is not None) + (args.vocab_file is not None) + external == 1,
            "give exactly one of --vocab-size, --vocab-file, or --tokenizer-type "
            f"{'/'.join(PATH_FLAG)} with its tokenizer")
    if external:  # the trainer's tokenizer's size, read from its files (without torch)
        try:
            args.vocab_size = vocab_size_without_torch(args, args.tokenizer_type)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    elif args.vocab_file is not None:
        require(os.path.isfile(args.vocab_file), f"--vocab-file {args.vocab_file}: no such file")
        try:
            with open(args.vocab_file, encoding="utf-8") as f:
                args.vocab_size = len(json.load(f))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"--vocab-file {args.vocab_file}: not a GPT-2 vocab.json ({e})") from None
    validation._resolve_activation_checkpointing(args)
    args.model_shape = ModelShape.from_args(args, vocab_size=args.vocab_size)
    args.memory_setup = _training_setup(args)
    return args


# what deepspeed.add_config_arguments adds to the trainer's parser (tests/integration/test_param_count_tool.py
# checks the list against the installed DeepSpeed); importing DeepSpeed here would import torch
DEEPSPEED_FLAGS = {"--deepspeed": 0, "--deepspeed_config": 1, "--deepscale": 0, "--deepscale_config": 1}


def _unknown_to_the_trainer(rest: list[str]) -> list[str]:
    """The flags among those this tool did not read that pretrain_gpt.py does not know either."""
    trainer = arguments.add_megatron_args(arguments.MegatronArgumentParser(add_help=False, allow_abbrev=False))
    for flag, nargs in DEEPSPEED_FLAGS.items():
        trainer.add_argument(flag, action="store_true") if nargs == 0 else trainer.add_argument(flag)
    _, unknown = trainer.parse_known_args(rest)
    return arguments.flag_names(unknown)


def _training_setup(args: argparse.Namespace) -> TrainingSetup:
    """The memory table's layout, precision, ZeRO stage and batch, checked like the trainer does."""
    mp = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.ds_sequence_parallel_size
    world = args.world_size or mp
    what = "TP x PP" if args.ds_sequence_parallel_size == 1 else "TP x PP x SP"
    require(world % mp == 0, f"--world-size {world} is not divisible by {what} = {mp}")
    require(not (args.fp16 and args.bf16), "--fp16 and --bf16 are exclusive: pick one")
    args.data_parallel_size = world // mp
    args.micro_batch_size = args.micro_batch_size or 1
    gbs = args.global_batch_size or args.micro_batch_size * args.data_parallel_size
    require(gbs % (args.micro_batch_size * args.data_parallel_size) == 0,
                       f"--global-batch-size {gbs} is not divisible by --micro-batch-size {args.micro_batch_size} "
                       f"x data-parallel size {args.data_parallel_size}")
    if args.rampup_batch_size:  # the trainer's rule: every ramp-up batch splits into micro batches x DP
        validation.validate_rampup(args, args.data_parallel_size)
    args.zero_stage = args.zero_stage or 0  # a stage outside 0-3: validate_flag_values refused it
    validation._validate_sequence_parallel(args)  # off at TP 1; TP must divide the sequence
    if args.accumulate_allreduce_grads_in_fp32:  # the ds_config key the trainer sets: where DeepSpeed runs it
        ds_config.check_grad_accum_dtype("fp32", args)
    return TrainingSetup.from_args(args)


def report(args: argparse.Namespace) -> list[str]:
    shape = args.model_shape
    counts = analytic_parameter_counts(shape)
    causal = args.flops_attention == "causal"  # the FLOPs convention, stated in the report
    flops = flops_per_sample(shape, args.checkpoint_activations, args.activations_checkpoint_method,
                             args.checkpoint_num_layers, causal=causal)
    lines = [
        f"parameters: {counts.total:,}",
        f"parameters without embeddings: {counts.no_embedding:,}",
    ] + ([f"active parameters: {counts.active:,}",
          f"active parameters without embeddings: {counts.active_no_embedding:,}"] if shape.is_moe else []) + [
        f"padded vocab size: {shape.padded_vocab_size:,} (vocab {shape.vocab_size:,}, "
        + (f"--pad-vocab-size-to {shape.pad_vocab_size_to:,})" if shape.pad_vocab_size_to is not None else
           f"multiple of {shape.make_vocab_size_divisible_by} x TP {shape.tensor_model_parallel_size})"),
    ] + format_parameter_report(counts, shape, checkpoint_activations=args.checkpoint_activations,
                                checkpoint_method=args.activations_checkpoint_method,
                                checkpoint_num_layers=args.checkpoint_num_layers, flops=flops,
                                sequence_parallel_size=args.ds_sequence_parallel_size, causal_attention=causal)
    if args.global_batch_size:
        lines.append(f"FLOPs per iteration (global batch {args.global_batch_size}): {flops * args.global_batch_size:,}")
    return lines + format_memory_report(shape, args.memory_setup) + split_comparison_lines(shape, args.memory_setup)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        args = parse_args(argv)
    except ConfigError as e:  # one line naming the flag, as pretrain_gpt.py prints it
        print(f"param_count.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.ignored_flags:
        print(f"param_count.py: ignored, not flags of pretrain_gpt.py (the numbers are for the model without "
              f"them): {', '.join(args.ignored_flags)}", file=sys.stderr)
    print("\n".join(report(args)))


if __name__ == "__main__":
    main()
