#!/usr/bin/env python
"""Exact parameter count and FLOPs of a GPT from Megatron flags, without building a model.

    python tools/param_count.py --num-layers 8 --hidden-size 512 --num-attention-heads 8 \
        --seq-length 1024 --vocab-size 50257 --tensor-model-parallel-size 2

Uses the same functions as the trainer's startup cross-check (megatron/utils.py). No torch, no
GPU; unknown flags are ignored, so a launch script's whole flag list can be pasted in."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron.utils import (COMPONENTS, analytic_parameter_counts, flops_per_sample,  # noqa: E402
                            pad_vocab_size, partition_layers)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--num-layers", type=int, required=True)
    p.add_argument("--hidden-size", type=int, required=True)
    p.add_argument("--num-attention-heads", type=int, required=True)
    p.add_argument("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden size")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--max-position-embeddings", type=int, default=None, help="default --seq-length")
    p.add_argument("--vocab-size", type=int, default=None, help="unpadded vocabulary size")
    p.add_argument("--vocab-file", type=str, default=None, help="GPT-2 vocab.json (instead of --vocab-size)")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--checkpoint-activations", action="store_true")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--global-batch-size", type=int, default=None)
    args, _ = p.parse_known_args(argv)
    if (args.vocab_size is None) == (args.vocab_file is None):
        p.error("give exactly one of --vocab-size or --vocab-file")
    if args.vocab_file is not None:
        if not os.path.isfile(args.vocab_file):
            p.error(f"--vocab-file {args.vocab_file}: no such file")
        with open(args.vocab_file, encoding="utf-8") as f:
            args.vocab_size = len(json.load(f))
    if args.hidden_size % args.num_attention_heads:
        p.error(f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads {args.num_attention_heads}")
    if args.num_layers < args.pipeline_model_parallel_size:
        p.error(f"--num-layers {args.num_layers} is smaller than --pipeline-model-parallel-size "
                f"{args.pipeline_model_parallel_size}")
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.max_position_embeddings = args.max_position_embeddings or args.seq_length
    args.padded_vocab_size = pad_vocab_size(args.vocab_size, args.make_vocab_size_divisible_by,
                                            args.tensor_model_parallel_size)
    return args


def report(args):
    counts = analytic_parameter_counts(args.num_layers, args.hidden_size, args.ffn_hidden_size,
                                       args.padded_vocab_size, args.max_position_embeddings,
                                       args.pipeline_model_parallel_size)
    flops = flops_per_sample(args.num_layers, args.hidden_size, args.ffn_hidden_size, args.seq_length,
                             args.padded_vocab_size, args.checkpoint_activations)
    lines = [
        f"estimated model parameters: {counts['total'] / 1e9}",
        f"estimated model parameters without embeddings: {counts['no_embedding'] / 1e9}",
        f"parameters: {counts['total']:,}",
        f"parameters without embeddings: {counts['no_embedding']:,}",
        f"padded vocab size: {args.padded_vocab_size:,} (vocab {args.vocab_size:,}, multiple of "
        f"{args.make_vocab_size_divisible_by} x TP {args.tensor_model_parallel_size})",
        "component           | params",
    ]
    lines += [f"{name:19s} | {counts['components'][name]:,}" for name in COMPONENTS]
    lines.append("stage | transformer layers | owned params")
    layers = partition_layers(args.num_layers, args.pipeline_model_parallel_size)
    lines += [f"{s:5d} | {n:18d} | {owned:,}" for s, (n, owned) in enumerate(zip(layers, counts["stages"]))]
    lines.append(f"FLOPs per sample (fwd+bwd{', recompute' if args.checkpoint_activations else ''}): {flops:,}")
    if args.global_batch_size:
        lines.append(f"FLOPs per iteration (global batch {args.global_batch_size}): {flops * args.global_batch_size:,}")
    return lines


def main(argv=None):
    print("\n".join(report(parse_args(argv))))


if __name__ == "__main__":
    main()
