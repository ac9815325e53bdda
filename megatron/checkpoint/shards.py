"""Reading one saved shard (a torch.save zip): a missing, truncated or corrupt file fails in one
line naming it, not with a pickle traceback. Shared by the readers of model and optimizer files
(reshard.py, zero_state.py)."""
import os
import zipfile
from typing import Any

import torch

from megatron.runtime.refusal import ConfigError


def missing(path: str) -> ConfigError:
    return ConfigError(f"{path}: checkpoint shard is missing; the checkpoint is incomplete")


def unreadable(path: str, error: BaseException) -> ConfigError:
    return ConfigError(f"{path}: checkpoint shard is unreadable ({type(error).__name__}); "
                       f"the checkpoint is incomplete or corrupt")


def load_shard(path: str) -> Any:
    """The object torch.save wrote to `path`, memory-mapped (nothing is read until used)."""
    if not os.path.isfile(path):
        raise missing(path)
    try:
        # our own client state holds numpy RNG states: not loadable with weights_only
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # truncated / corrupt file
        raise unreadable(path, e) from None


def check_shard(path: str) -> None:
    """The shard exists and its zip directory (at the end of the file) reads: cheap, nothing loaded."""
    if not os.path.isfile(path):
        raise missing(path)
    try:
        zipfile.ZipFile(path).close()
    except (zipfile.BadZipFile, OSError) as e:
        raise unreadable(path, e) from None
