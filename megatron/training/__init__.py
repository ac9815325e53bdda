"""The training package: the entry point pretrain() (pretrain), the Trainer that owns one run
(trainer), initialize_megatron (initialize), the data iterators (data_iterators), the DeepSpeed
engine wrapper (engine), the optimizer (optimizer), the exit signal handler (exit_signal) and the
loss checks (loss_check).

`from megatron.training import pretrain` is Megatron-DeepSpeed's spelling, kept for users' code."""
from megatron.training.pretrain import (
    LossCheckStop,
    NonFiniteLoss,
    SpikyLoss,
    Trainer,
    TrainerHooks,
    exit_signals,
    pretrain,
)

__all__ = ["LossCheckStop", "NonFiniteLoss", "SpikyLoss", "Trainer", "TrainerHooks", "exit_signals", "pretrain"]
