"""A CheckpointManager for validated args outside a launch (what initialize_megatron and the
Trainer build from the run configuration)."""
from argparse import Namespace

from megatron.checkpoint.config import CheckpointConfig
from megatron.checkpoint.manager import CheckpointManager
from megatron.runtime.parallel_layout import ParallelLayout


def checkpoint_manager(args: Namespace, rank: int = 0) -> CheckpointManager:
    """`args` validated, with the model shape complete (the tokenizer's vocab in it)."""
    if getattr(args, "rank", None) is None:
        args.rank = rank
    return CheckpointManager(CheckpointConfig.from_args(args, ParallelLayout.from_args(args)))
