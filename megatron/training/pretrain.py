"""pretrain(): initialize, then build a Trainer (megatron/training/trainer.py) and run it: the model and
optimizer (Trainer.setup_model_and_optimizer), the data (Trainer.build_data_iterators), the loop
(Trainer.train, Trainer.train_step), evaluation, checkpoints and exits.
"""
from argparse import Namespace
from collections.abc import Callable

from megatron import print_rank_0
from megatron.checkpoint.lock import release_all
from megatron.schedules.progress import TrainingProgress
from megatron.training.initialize import initialize_megatron
from megatron.training.loss_check import LossCheckStop, NonFiniteLoss, SpikyLoss
from megatron.training.time_budget import earliest_process_start
from megatron.training.trainer import Trainer, TrainerHooks, exit_signals

__all__ = ["LossCheckStop", "NonFiniteLoss", "SpikyLoss", "Trainer", "TrainerHooks", "exit_signals", "pretrain"]


def pretrain(train_valid_test_dataset_provider: Callable, model_provider: Callable, forward_step_func: Callable,
             batch_fn: Callable, extra_args_provider: Callable | None = None, args_list: list[str] | None = None,
             hooks: TrainerHooks | None = None) -> tuple[Namespace, TrainingProgress]:
    """forward_step_func(batch, model) -> loss for the non-pipeline engine; batch_fn(data) ->
    (inputs, labels) for the pipeline engine. Returns (args, progress) when the run ends.
    `hooks`: a TrainerHooks that watches the run (tests/support/pretrain_driver.py records through one)."""
    try:
        args = initialize_megatron(extra_args_provider, args_list)
        # --exit-duration-in-mins counts from here: the earliest rank's process start (as Megatron-LM)
        start = earliest_process_start()
        # BigScience: a kill switch present at startup ends the job at once; no Trainer was built, so
        # no metrics and no TensorBoard writer were opened: only --save's lock to give back
        if exit_signals(start, args.run_config.exit)[1]:
            print_rank_0(f"Detected kill switch at {args.run_config.exit.kill_switch_path}. Exiting")
            release_all()
            return args, TrainingProgress()
        trainer = Trainer(args, model_provider, forward_step_func, hooks=hooks, start_time=start)
        trainer.run(train_valid_test_dataset_provider, batch_fn)
    except BaseException:
        release_all()  # --save's lock, taken at startup (at exit too; this also serves runs made in-process)
        raise
    return args, trainer.progress
