#!/usr/bin/env python
"""Exact parameter count and FLOPs of a GPT from Megatron flags, without building a model.

    python tools/param_count.py --num-layers 8 --hidden-size 512 --num-attention-heads 8 \
        --seq-length 1024 --vocab-size 50257 --tensor-model-parallel-size 2

The flags, their defaults and the shape's validation are the trainer's own (megatron/arguments.py,
megatron/model/shape.py); the numbers come from the same analytic functions the trainer's
startup cross-check uses and are printed by the same report. No torch, no GPU; unknown flags are
ignored, so a launch script's whole flag list can be pasted in."""
import argparse
import json
import os

from megatron import arguments
from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.model.shape import ConfigError, ModelShape
from megatron.utils import format_parameter_report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    for add in (arguments._add_network_size_args, arguments._add_distributed_args, arguments._add_training_args,
                arguments._add_data_args, arguments._add_moe_args):
        add(p)
    args, _ = p.parse_known_args(argv)
    if (args.vocab_size is None) == (args.vocab_file is None):
        p.error("give exactly one of --vocab-size or --vocab-file")
    if args.vocab_file is not None:
        if not os.path.isfile(args.vocab_file):
            p.error(f"--vocab-file {args.vocab_file}: no such file")
        try:
            with open(args.vocab_file, encoding="utf-8") as f:
                args.vocab_size = len(json.load(f))
        except (ValueError, UnicodeDecodeError) as e:
            p.error(f"--vocab-file {args.vocab_file}: not a GPT-2 vocab.json ({e})")
    try:
        args.model_shape = ModelShape.from_args(args, vocab_size=args.vocab_size)
    except ConfigError as e:
        p.error(str(e))
    return args


def report(args):
    shape = args.model_shape
    counts = analytic_parameter_counts(shape)
    lines = [
        f"parameters: {counts.total:,}",
        f"parameters without embeddings: {counts.no_embedding:,}",
    ] + ([f"active parameters: {counts.active:,}",
          f"active parameters without embeddings: {counts.active_no_embedding:,}"] if shape.is_moe else []) + [
        f"padded vocab size: {shape.padded_vocab_size:,} (vocab {shape.vocab_size:,}, multiple of "
        f"{shape.make_vocab_size_divisible_by} x TP {shape.tensor_model_parallel_size})",
    ] + format_parameter_report(counts, shape, checkpoint_activations=args.checkpoint_activations)
    if args.global_batch_size:
        flops = flops_per_sample(shape, args.checkpoint_activations)
        lines.append(f"FLOPs per iteration (global batch {args.global_batch_size}): {flops * args.global_batch_size:,}")
    return lines


def main(argv=None):
    print("\n".join(report(parse_args(argv))))


if __name__ == "__main__":
    main()
