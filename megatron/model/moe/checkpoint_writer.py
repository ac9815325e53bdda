"""Which ranks write their files while DeepSpeed saves an MoE model."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deepspeed import DeepSpeedEngine

from megatron import mpu
from megatron.runtime import deepspeed_internals as ds_internals


@contextlib.contextmanager
def every_tp_rank_writes_its_files(engine: DeepSpeedEngine) -> Iterator[None]:
    """While DeepSpeed saves an MoE model: a rank writes its expert files, optimizer state and
    model state when it is expert-data-parallel rank 0 (DeepSpeed's rule) or in DP replica 0.
    With whole experts DeepSpeed's expert-data-parallel groups hold TP peers (their gradients are
    summed there, each TP rank having run a slice of the experts' capacity), so with EP < TP its
    rule alone would write nothing for TP ranks >= EP, and the checkpoint would not load."""
    with ds_internals.data_parallel_writer_also(engine, lambda: mpu.get_data_parallel_rank() == 0):
        yield
