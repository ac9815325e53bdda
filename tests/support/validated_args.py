"""Flags through megatron.config.arguments' parser and validation, in-process (no launch)."""
from megatron.config.arguments import parse_args
from megatron.config.validation import validate_args

BASE = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "10", "--lr", "1e-3", "--mock-data", "--vocab-size", "600"]


def validated(extra=(), world_size=1, cuda=False, base=BASE):
    args = parse_args(args_list=list(base) + [str(x) for x in extra])
    return validate_args(args, world_size=world_size, cuda_available=cuda)
