"""--log-level / --log-level-replica (BigScience's Megatron-DeepSpeed): the level of the Python
loggers on rank 0 and on every other rank — this code base's own (`megatron`), DeepSpeed's, and
transformers' when a tokenizer brought it in. Unset leaves each library's default."""
import logging
import sys
from argparse import Namespace

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}


def apply_log_levels(args: Namespace, rank: int) -> None:
    name = args.log_level if rank == 0 else args.log_level_replica
    if name is None:
        return
    from megatron.runtime.deepspeed_internals import deepspeed_logger
    loggers = [logging.getLogger("megatron"), deepspeed_logger()]
    if "transformers" in sys.modules:
        loggers.append(logging.getLogger("transformers"))
    for logger in loggers:
        logger.setLevel(LEVELS[name])
