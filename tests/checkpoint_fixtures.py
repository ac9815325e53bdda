"""A CheckpointManager for validated args outside a launch (what initialize_megatron and the
Trainer build from the run configuration)."""
from argparse import Namespace

from megatron.checkpoint.manager import CheckpointManager
from megatron.run_config import ResumePlan, RunConfig


def checkpoint_manager(args: Namespace, rank: int = 0) -> CheckpointManager:
    """`args` validated, with the model shape complete (the tokenizer's vocab in it)."""
    if getattr(args, "rank", None) is None:
        args.rank = rank
    return CheckpointManager.from_run_config(RunConfig.from_args(args, ResumePlan(), None))
