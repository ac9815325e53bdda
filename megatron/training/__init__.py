"""The training package: the entry point pretrain() (pretrain), the Trainer that owns one run
(trainer), initialize_megatron (initialize), the data iterators (data_iterators), the DeepSpeed
engine wrapper (engine), the optimizer (optimizer) and the exit signal handler (exit_signal).

`from megatron.training import pretrain` is Megatron-DeepSpeed's spelling, kept for users' code."""
from megatron.training.pretrain import NonFiniteLoss, Trainer, TrainerHooks, exit_signals, pretrain

__all__ = ["NonFiniteLoss", "Trainer", "TrainerHooks", "exit_signals", "pretrain"]
