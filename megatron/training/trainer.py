"""The Trainer: one run's engine, LR scheduler, batch calculator, progress, parameter counts,
metrics and checkpointing, and the loop that trains, evaluates, saves and exits
(megatron.training.pretrain builds one and runs it).

Model size and FLOPs per sample are computed once in Trainer.setup_model_and_optimizer (see
megatron/utils.py); the logger only reads them.
"""
import os
import time
from argparse import Namespace
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import deepspeed
import torch

from megatron import mpu, print_rank_0
from megatron.checkpoint.manager import CheckpointManager, set_rng_state
from megatron.config.run_config import ExitSettings, LRSchedule, RunConfig
from megatron.metrics import progress_log
from megatron.metrics.processor import MetricsProcessor
from megatron.metrics.rank_timing import gather_rank_times
from megatron.metrics.split_comparison import split_comparison_lines
from megatron.metrics.training_log import IntervalStats
from megatron.model.analytic import ParameterCounts, gigaflos_no_embeds
from megatron.model.compiled import compile_transformer_layers
from megatron.mpu.tp_sync import install_tp_duplicate_sync
from megatron.runtime.deepspeed_internals import save_and_load_as_moe, skip_gradient_allreduce
from megatron.runtime.global_vars import get_timers
from megatron.schedules.curriculum import CurriculumSchedule, truncate_sample_batch
from megatron.schedules.learning_rates import AnnealingLR
from megatron.schedules.microbatches import NumMicroBatchesCalculator, num_train_iterations
from megatron.schedules.progress import TrainingProgress
from megatron.schedules.skip_iterations import skip_iteration, skipped_range
from megatron.training.data_iterators import NamedIterators, build_data_iterators
from megatron.training.engine import engine_steps, pop_moe_loss
from megatron.training.exit_signal import ExitSignalHandler
from megatron.training.loss_check import (
    NON_FINITE,
    SPIKY,
    SPIKY_LOSS_FACTOR,
    SPIKY_LOSS_SAMPLES,
    NonFiniteLoss,
    SpikyLoss,
    agree_on_loss,
)
from megatron.training.optimizer import build_optimizer, uses_own_clipping
from megatron.training.time_budget import TimeBudget, first_save_estimate, out_of_time, stop_line
from megatron.utils import (
    cache_parameter_counts,
    check_parameter_counts,
    compute_parameter_counts,
    format_parameter_report,
)


class TrainerHooks:
    """What a Trainer reports while it runs, for tests and tools that watch a run without rewiring
    it. Every method is a no-op here: subclass, override what you need, pass it as `hooks=`."""

    def on_parameter_counts(self, trainer: "Trainer", counts: ParameterCounts) -> None:
        """Each time the run counts its parameters (once, at build)."""

    def on_build(self, trainer: "Trainer") -> None:
        """Once the engine, scheduler and batch calculator are built, before --load."""

    def on_load(self, trainer: "Trainer") -> None:
        """After --load restored the engine, the scheduler and the progress."""

    def on_batch(self, trainer: "Trainer", data: dict) -> None:
        """Every batch a data loader hands over (any split), before batch_fn."""

    def on_step_start(self, trainer: "Trainer") -> None:
        """Before each training iteration (trainer.progress.iteration is the last finished one)."""

    def on_step_end(self, trainer: "Trainer", loss: torch.Tensor) -> None:
        """After each training iteration, with its loss as the engine returned it."""

    def on_log_start(self, trainer: "Trainer", stats: IntervalStats, lr: float) -> None:
        """Right before the iteration's log line is written (what it averages: `stats`)."""

    def on_log_end(self, trainer: "Trainer") -> None:
        """Right after the log line (also when writing it failed)."""

    def on_evaluate(self, trainer: "Trainer", prefix: str, name: str | None, loss: float) -> None:
        """Each evaluation's mean loss, before its line; `name`: the data group, if any."""

    def on_stop_flags(self, trainer: "Trainer", flags: "StopFlags") -> None:
        """The exit flags the ranks agreed on after each iteration (and, with
        --exit-duration-in-mins, once before the first), with the times the budget was judged on."""


class StopFlags(NamedTuple):
    """What the ranks agreed on after an iteration (stop_flags): each True when any rank saw it."""
    late: bool = False        # --exit-duration-in-mins: one more iteration and a save would not fit
    killed: bool = False      # the --kill-switch-path file exists
    signalled: bool = False   # a stop signal (exit_signal.py), or a launcher that went away
    # with --exit-duration-in-mins: (used, longest iteration, save) in seconds, the ranks' MAX of each
    times: tuple[float, float, float] | None = None


class Trainer:
    """One run: owns the engine, the LR scheduler, the batch-size calculator, the progress, the
    parameter counts, the metrics (a MetricsProcessor: log line, TensorBoard writer, MFU, memory
    probe, zeros in grad) and checkpointing; each part decides when it acts (`metrics.should_log`,
    `_should_evaluate`, ...).
    Built from the functions pretrain() takes; `run()` is what pretrain() does after startup."""

    def __init__(self, args: Namespace, model_provider: Callable, forward_step_func: Callable,
                 hooks: TrainerHooks | None = None, start_time: float | None = None) -> None:
        self.args = args
        # its sections of the run configuration (megatron/config/run_config.py), built once by
        # initialize_megatron: the one way to make a Trainer (tests and benchmarks go through it too)
        config: RunConfig = args.run_config
        self.config = config
        self.lr_schedule = config.lr_schedule
        self.batch = config.batch
        self.data = config.data
        self.evaluation = config.evaluation
        self.exit = config.exit
        self.optimizer_settings = config.optimizer
        self.precision = config.precision
        self.parallel = config.parallel
        self.shape = config.model_shape
        # the ds_config's sequence-length curriculum (megatron/schedules/curriculum.py), or None
        self.curriculum: CurriculumSchedule | None = config.curriculum
        self.seqlen = self.batch.seq_length  # the length the running (or last) training iteration trains at
        # a plain deep copy (DeepSpeed may write into the dict it is given)
        self.deepspeed_config = config.deepspeed_config_dict()
        self.hooks = hooks or TrainerHooks()
        self.start_time = time.time() if start_time is None else start_time
        self.progress = TrainingProgress()
        self.total_iterations = num_train_iterations(args)  # the log line's denominator
        self.train_iter: Iterator | None = None
        self.valid_iters: NamedIterators = None  # [(group name, iterator)] or None
        self.test_iters: NamedIterators = None
        self.exit_signal: ExitSignalHandler | None = None  # the stop signals' handler (run())
        # --check-for-spiky-loss: how many of the run's first losses make the reference (a test may lower it)
        self.spiky_loss_samples = SPIKY_LOSS_SAMPLES
        # the iteration whose update made the weights now trained on (the start's, before the first):
        # the checkpoints saved from there on hold the weights a bad loss came from
        self.weights_iteration = 0
        self.job_start_operations = 0  # the model FLOPs done when this job started (after --load)
        self.loss_stop: tuple[str, str] | None = None  # a loss check's stop line, before and after the trackers
        # owns the TensorBoard writer; reads the counts and FLOPs cached on args once the model is built
        self.metrics = MetricsProcessor(config.logging, cache=args)
        # --save's lock was taken, and the directory checked, by initialize_megatron
        self.checkpointer = CheckpointManager(config.checkpoint)
        self.budget = self._time_budget()
        self.setup_model_and_optimizer(model_provider)
        self.steps = engine_steps(self.engine, forward_step_func, self.parallel.ds_pipeline_enabled,
                                  self.batch.seq_length)

    # --- build ---------------------------------------------------------------------------------

    def _time_budget(self) -> TimeBudget:
        """--exit-duration-in-mins from self.start_time (pretrain(): the earliest rank's process
        start); the first save's estimate from the predicted checkpoint size (time_budget.py)."""
        minutes = self.exit.exit_duration_in_mins
        size = self.checkpointer.checkpoint_bytes() if self.checkpointer.config.save else 0
        budget = TimeBudget(60 * minutes if minutes else None, self.start_time,
                            first_save_estimate(size) if size else 0.0)
        if minutes:
            began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start_time))
            print_rank_0(f"--exit-duration-in-mins {minutes}: {budget.seconds:.3f} s from {self.start_time:.3f} "
                         f"({began}, the start of the earliest rank's process); until a save is measured, one is "
                         f"estimated at {budget.save_estimate:.3f} s ({size} bytes predicted)")
        return budget

    def setup_model_and_optimizer(self, model_provider: Callable) -> None:
        args = self.args
        model = model_provider(args)
        if args.torch_compile:
            print_rank_0(f"--torch-compile: {compile_transformer_layers(model)} transformer layers compiled in place "
                         f"(inductor); the first iterations include their compilation")
        if self.config.tensor_parallel.sync_duplicated_parameters:
            install_tp_duplicate_sync(model, mpu)
        # Megatron SP: norms and row-parallel biases saw one sequence shard each
        if self.config.tensor_parallel.sequence_parallel:
            mpu.install_sequence_parallel_grad_allreduce(model)
        # the one and only parameter count of the run
        self.counts = compute_parameter_counts(model, mpu, self.shape)  # stops on a parameter the table lacks
        self.hooks.on_parameter_counts(self, self.counts)
        check_parameter_counts(self.counts, self.shape)  # stops on a count that differs from the table's
        cache_parameter_counts(args, self.counts)
        report = format_parameter_report(self.counts, self.shape, self.parallel.data_parallel_size,
                                         self.config.recompute.checkpoint_activations, self.config.recompute.method,
                                         self.config.recompute.num_layers, flops=args.flops_per_sample,
                                         sequence_parallel_size=self.parallel.sequence_parallel_size,
                                         causal_attention=args.flops_attention == "causal")
        for line in report:
            print_rank_0(line)
        if self.curriculum:
            print_rank_0(self.curriculum.describe(self.batch.seq_length))
        # when --pp-partition-method flops would split otherwise: its speed-up and both memories
        for line in split_comparison_lines(self.shape, self.metrics.config.memory):
            print_rank_0(line)
        self.metrics.log_model_size(report)

        optimizer = build_optimizer(model, self.optimizer_settings, self.precision)
        own_clipping = uses_own_clipping(self.optimizer_settings, self.precision)
        self.metrics.watch_optimizer(optimizer, model)  # --log-num-zeros-in-grad: after the clipping hook
        batch = self.batch
        self.calculator = NumMicroBatchesCalculator(batch.global_batch_size, batch.micro_batch_size,
                                                    self.parallel.data_parallel_size, batch.rampup_batch_size)
        self.lr_scheduler = _build_lr_scheduler(optimizer, self.lr_schedule)
        config = self.deepspeed_config
        if own_clipping:
            config["gradient_clipping"] = 0.0  # the optimizer hook clips (see megatron/training/optimizer.py)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                               mpu=None if self.parallel.ds_pipeline_enabled else mpu)
        weight_holders = self.parallel.data_parallel_size * self.parallel.sequence_parallel_size
        if weight_holders == 1 and own_clipping and not self.shape.is_moe:
            # fp32, one rank holds the weights (no DP replica, no Ulysses SP rank whose gradient
            # share is summed in): nothing to reduce, yet DeepSpeed would flatten every gradient, scale
            # it by 1/1, all-reduce it over one rank and copy it back (~2% of a CPU step)
            skip_gradient_allreduce(engine)  # DeepSpeedEngine.backward, PipelineEngine's ReduceGrads
        if self.shape.is_moe:
            # every pipeline stage takes DeepSpeed's MoE checkpoint path, also one without an MoE layer:
            # its per-layer path would end the load with a tied-weight broadcast the others never join
            save_and_load_as_moe(engine)
        self.engine = engine
        self.lr_scheduler.optimizer = engine.optimizer  # DeepSpeed may wrap it; the wrapper owns param_groups
        # predicted memory per rank, MFU peak; arms the first iteration's measurement
        self.metrics.startup_report(engine)
        self.lr_scheduler.step(0)
        self.hooks.on_build(self)

    def load(self) -> dict | None:
        """--load: the engine, scheduler and progress as saved; returns the saved RNG state."""
        rng_state = self.checkpointer.load(self.engine, self.lr_scheduler, self.progress)
        self.hooks.on_load(self)
        return rng_state

    def build_data_iterators(self, dataset_provider: Callable, batch_fn: Callable) -> None:
        """The splits' iterators, from where the progress stands (megatron/training/data_iterators.py)."""
        def watched(data: Any) -> Any:  # a batch as the loader yields it; batch_fn's result
            self.hooks.on_batch(self, data)
            return batch_fn(data)

        def cut(data: Any) -> Any:  # a curriculum's training batch: cut to the running iteration's length
            self.hooks.on_batch(self, data)
            return batch_fn(truncate_sample_batch(data, self.seqlen))
        self.train_iter, self.valid_iters, self.test_iters = build_data_iterators(
            dataset_provider, self.args, self.data, self.evaluation, self.progress, watched, self.total_iterations,
            train_batch_fn=cut if self.curriculum else None)

    def run(self, dataset_provider: Callable, batch_fn: Callable) -> str:
        """Load, build the data, train, then the end-of-run evaluation and save (or the exit save).
        Returns why training stopped (see `train`). The stop signals' handler is in place from
        here to the end of the exit save: a signal during --load stops the run after its first
        iteration, and a second one (DeepSpeed's launcher repeats SIGTERM) cannot cut the save."""
        self.exit_signal = self._install_exit_signal_handler()
        try:
            return self._run(dataset_provider, batch_fn)
        finally:
            if self.exit_signal is not None:
                self.exit_signal.release()

    def _install_exit_signal_handler(self) -> ExitSignalHandler | None:
        """With --save or --exit-signal-handler, SIGTERM, SIGINT (Ctrl-C) and --exit-signal save and
        exit after the iteration in progress (megatron/training/exit_signal.py); a run with neither has
        nothing to save, and the signals end it at once. Said in one line either way."""
        settings = self.exit
        if not (settings.exit_signal_handler or self.checkpointer.config.save):
            print_rank_0("stop signals: SIGTERM and SIGINT (Ctrl-C) end this run at once (no --save and no "
                         "--exit-signal-handler: nothing to save)")
            return None
        handler = ExitSignalHandler(settings.exit_signal if settings.exit_signal_handler else "SIGTERM").install()
        print_rank_0(f"stop signals: {', '.join(handler.names)} or a launcher that exits: every rank "
                     f"{'saves and ' if self.checkpointer.config.save else ''}exits after the iteration in "
                     f"progress; a second signal changes nothing (SIGKILL ends it at once)")
        return handler

    def _run(self, dataset_provider: Callable, batch_fn: Callable) -> str:
        progress = self.progress
        self._log_progress("Starting job")
        rng_state = self.load() if self.checkpointer.config.load else None
        self.job_start_operations = progress.floating_point_operations  # --log-progress's job throughput
        self.calculator.update(progress.consumed_train_samples)
        self.engine.set_train_batch_size(self.calculator.get_current_global_batch_size())
        self.build_data_iterators(dataset_provider, batch_fn)
        if rng_state is not None:  # last: nothing in setup may draw from the RNG after this
            set_rng_state(rng_state)
        print_rank_0(f"time to initialize and build (s): {time.time() - self.start_time:.2f}")
        stop = "finished"
        if self.batch.train_iters is None or progress.iteration < self.batch.train_iters:
            stop = self.train()
        self.finish(stop)
        if stop == NON_FINITE:
            raise NonFiniteLoss(f"iteration {progress.iteration}: non-finite lm loss or gradient norm")
        if stop == SPIKY:
            raise SpikyLoss(f"iteration {progress.iteration}: spiky lm loss")
        return stop

    # --- train ---------------------------------------------------------------------------------

    def train_step(self, data_iterator: Iterator | None = None) -> tuple[torch.Tensor, int]:
        """One iteration: the batch through the engine, then the bookkeeping that follows from it.
        Returns the loss (a tensor: no host sync here) and the global batch it was computed on.

        An fp16 step whose gradients overflowed updates nothing: the LR schedule does not advance and
        the step is counted as skipped. Its samples were consumed and its compute spent, so consumed
        samples and gigaflos advance as for any other iteration (as in Megatron-DeepSpeed).

        Tokens, gigaflos and a token-based LR schedule count the length the iteration trained at
        (a curriculum's, `self.seqlen`), as the forks count it."""
        progress, calculator = self.progress, self.calculator
        self.hooks.on_step_start(self)
        gbs = calculator.get_current_global_batch_size()
        self.seqlen = seq_length = self.trained_seqlen(progress.iteration + 1)
        loss = self.steps.train_batch(self.train_iter if data_iterator is None else data_iterator, seq_length)
        if self.engine.was_step_applied():
            self.lr_scheduler.step(gbs, tokens=gbs * seq_length)
        else:
            progress.skipped_iterations += 1
        progress.iteration += 1
        progress.consumed_train_samples += gbs
        progress.consumed_train_tokens += gbs * seq_length
        # C = 6 N D with N the parameters a token passes through (the active ones of an MoE model;
        # the count the model build cached on args, megatron/utils.py)
        progress.gigaflos_no_embeds += gigaflos_no_embeds(gbs, seq_length, self.args.parameters_active_no_embedding)
        # the model's FLOPs of this iteration from the FLOPs per sample cached at model build (--log-progress)
        progress.floating_point_operations += gbs * self.args.model_flops_per_sample_at[seq_length]
        calculator.update(progress.consumed_train_samples)
        self._follow_batch_size(gbs)
        self.hooks.on_step_end(self, loss)
        return loss, gbs

    def trained_seqlen(self, iteration: int) -> int:
        """The sequence length iteration `iteration` (1-based) trains at: the curriculum's, which
        is a function of the iteration alone (a resumed run continues it exactly), else --seq-length."""
        return self.curriculum.seqlen(iteration) if self.curriculum else self.batch.seq_length

    def _follow_batch_size(self, gbs: int) -> None:
        """--rampup-batch-size: the engine takes the calculator's new global batch."""
        if self.calculator.get_current_global_batch_size() != gbs:
            self.engine.set_train_batch_size(self.calculator.get_current_global_batch_size())

    def train(self) -> str:
        """Trains until the schedule ends ("finished"), an exit flag fires ("exit-interval",
        "exit-duration", "kill-switch": the file appeared, "exit-signal": a stop signal) or
        a loss check stops it ("non-finite", "spiky": megatron/training/loss_check.py); returns which."""
        timers = get_timers()
        self.engine.train()
        stats = IntervalStats()
        announced: set = set()
        self.weights_iteration = self.progress.iteration
        if self.budget.seconds:  # startup (a long --load) may have spent the budget already
            flags = self.agree_on_stop()
            if flags.late:
                self._report_late(flags)
                return "exit-duration"
        while True:
            if self._schedule_done():
                return "finished"
            began = time.time()
            # a skipped iteration (--skip-train-iteration-range) trains, logs and evaluates nothing,
            # but saves and stops like a trained one: a --save-interval or --exit-interval inside
            # the range, or a signal that arrives while its batches are read, still takes effect
            if not self._skip_iteration(announced):
                # the interval time covers training steps only, not evaluation or checkpoint saves
                timers("interval-time").start()
                loss, gbs = self.train_step()
                timers("interval-time").stop()
                # before anything is logged or saved from this iteration
                bad, largest = self.check_loss(loss)
                if bad:
                    self.loss_stop = self._loss_stop_line(bad, loss, largest)
                    return bad
                if self.engine.was_step_applied():
                    self.weights_iteration = self.progress.iteration
                stats.add(loss, gbs, self.engine.was_step_applied(), moe_loss=pop_moe_loss(), seqlen=self.seqlen)
                self.measure_memory()  # once, after the first iteration: measured vs predicted memory
                if self.metrics.should_log(self.progress.iteration):
                    self.log(stats, timers("interval-time").elapsed(), gbs)
                    stats = IntervalStats()
                if self._should_evaluate():
                    self.validate(f"iteration {self.progress.iteration}")
            self.budget.iteration_took(time.time() - began)
            if self._should_save():
                self.save()
            # after the log and the save, as before: a switch that appeared meanwhile stops this iteration
            stop = self._should_exit(self.agree_on_stop())
            if stop:
                return stop

    def _schedule_done(self) -> bool:
        batch, progress = self.batch, self.progress
        return ((batch.train_iters is not None and progress.iteration >= batch.train_iters)
                or (batch.train_samples is not None and progress.consumed_train_samples >= batch.train_samples)
                or (batch.train_tokens is not None and progress.consumed_train_tokens >= batch.train_tokens))

    def _skip_iteration(self, announced: set) -> bool:
        """--skip-train-iteration-range: read and drop this iteration's batches
        (megatron/schedules/skip_iterations.py); True when this iteration was skipped."""
        skipped = skipped_range(self.data.skip_train_iteration_range, self.progress.iteration + 1)
        if not skipped:
            return False
        if skipped not in announced:
            announced.add(skipped)
            print_rank_0(f"skipping iterations {self.progress.iteration + 1} to {skipped[1]} "
                         f"(--skip-train-iteration-range)")
        gbs = self.calculator.get_current_global_batch_size()
        seqlen = self.trained_seqlen(self.progress.iteration + 1)
        skip_iteration(self.calculator, self.train_iter, self.progress, seqlen)
        self._follow_batch_size(gbs)
        return True

    def _should_evaluate(self) -> bool:
        evaluation = self.evaluation
        return (self.valid_iters is not None and bool(evaluation.eval_interval)
                and self.progress.iteration % evaluation.eval_interval == 0 and evaluation.eval_iters > 0)

    def _should_save(self) -> bool:
        return self.checkpointer.should_save(self.progress.iteration)

    def check_loss(self, loss: torch.Tensor) -> tuple[str | None, float]:
        """--check-for-nan-in-loss-and-grad / --check-for-spiky-loss: ("non-finite", "spiky" or None;
        the largest finite loss of every rank), agreed by every rank (megatron/training/loss_check.py:
        one all-reduce, none with both off)."""
        return agree_on_loss(loss, self.engine, self.exit.check_for_nan_in_loss_and_grad,
                             self.exit.check_for_spiky_loss, self.progress, self.spiky_loss_samples)

    def agree_on_stop(self) -> StopFlags:
        """The exit flags after this iteration, agreed by every rank (stop_flags)."""
        received = None if self.exit_signal is None else self.exit_signal.received is not None
        flags = stop_flags(self.exit, self.budget, received)
        self.hooks.on_stop_flags(self, flags)
        return flags

    def _report_late(self, flags: StopFlags) -> None:
        """The one line of a budget stop, with the agreed times it was decided on."""
        assert self.budget.seconds is not None and flags.times is not None
        print_rank_0(stop_line(self.budget.seconds, *flags.times, saved_before=self.budget.last_save is not None,
                               iteration_number=self.progress.iteration))

    def _loss_stop_line(self, bad: str, loss: torch.Tensor, largest: float) -> tuple[str, str]:
        """A loss check's stop line, around what --save now tracks (finish fills that in)."""
        it, progress = self.progress.iteration, self.progress
        if bad == NON_FINITE:
            what = (f"the lm loss ({float(loss):.6E}) or the gradient norm ({self.engine.get_global_grad_norm()}) "
                    "is not finite")
            way_on = "--no-check-for-nan-in-loss-and-grad trains on"
        else:  # the largest of every rank's losses (each DP rank has its own without the pipeline engine)
            what = (f"the lm loss ({largest:.6E}) is at least {SPIKY_LOSS_FACTOR} times the largest of the run's "
                    f"first {progress.spiky_loss_samples} ({progress.spiky_loss_max:.6E}, --check-for-spiky-loss)")
            way_on = "without --check-for-spiky-loss it trains on"
        # the update that made the weights (iteration 1 for the initial ones) up to the loss they gave
        first = max(self.weights_iteration, 1)
        return (f"stopping at iteration {it}: {what}; nothing saved at this iteration",
                f"Resume with a lower --lr or skip the data from that update on with --skip-train-iteration-range "
                f"{first}-{it} ({way_on})")

    def _should_exit(self, flags: StopFlags) -> str | None:
        settings = self.exit
        if settings.exit_interval and self.progress.iteration % settings.exit_interval == 0:
            return "exit-interval"
        if flags.killed:
            print_rank_0(f"Detected kill switch at {settings.kill_switch_path}. Exiting")
            return "kill-switch"
        if flags.signalled:
            # rank 0's own reason when it has one (every rank that got the signal has)
            why = self.exit_signal.received if self.exit_signal is not None else None
            why = why or "another rank received a stop signal or lost its launcher"
            print_rank_0(f"stop signal: {why}; saving and exiting after iteration {self.progress.iteration}")
            return "exit-signal"
        if flags.late:
            self._report_late(flags)
            return "exit-duration"
        return None

    # --- metrics -------------------------------------------------------------------------------

    def log(self, stats: IntervalStats, elapsed: float, global_batch_size: int) -> None:
        """The iteration's log line and scalars, over the iterations `stats` adds up."""
        lr = self.lr_scheduler.get_lr()
        values = self.metrics.step_values(self.engine)
        if self.metrics.config.timing_log_option:  # every rank's own time (one all-gather), before the line
            values["rank_times"] = gather_rank_times(1000.0 * elapsed / stats.iterations)
        self.hooks.on_log_start(self, stats, lr)
        try:
            self.metrics.log_training(stats, elapsed, self.progress, lr=lr, global_batch_size=global_batch_size,
                                      total_iterations=self.total_iterations,
                                      curriculum_seqlen=self.seqlen if self.curriculum else None, **values)
        finally:
            self.hooks.on_log_end(self)
        self.metrics.log_optimizer_states(self.engine, self.progress)  # --log-optimizer-states-to-tensorboard

    def measure_memory(self) -> list | None:
        """Once, after the first iteration: every rank measures what it holds, the last rank prints
        it next to the prediction (megatron/metrics/memory_measure.py). Later calls return the same."""
        first = self.metrics.memory_probe is not None
        measured = self.metrics.measure_memory()
        if first and measured is not None and self.seqlen < self.batch.seq_length:
            print_rank_0(f"note: the measured activations are of a {self.seqlen}-token iteration (the curriculum's "
                         f"first); the prediction is for --seq-length {self.batch.seq_length}")
        return measured

    # --- evaluate ------------------------------------------------------------------------------

    def evaluate(self, data_iterator: Iterator) -> tuple[float, int]:
        """Mean loss over --eval-iters batches of the current global batch size, and the samples read."""
        eval_iters = self.evaluation.eval_iters
        self.engine.eval()
        total = 0.0
        for _ in range(eval_iters):
            total += float(self.steps.eval_batch(data_iterator))
        self.engine.train()
        return total / eval_iters, eval_iters * self.calculator.get_current_global_batch_size()

    def validate(self, prefix: str) -> None:
        """Evaluate on the validation split (each group of --valid-weighted-split-paths on its own,
        logged under its name); the samples read from each move the saved validation position."""
        for name, valid_iter in self.valid_iters:
            loss, samples = self.evaluate(valid_iter)
            self._log_evaluation(prefix, loss, name)
        self.progress.consumed_valid_samples += samples

    def _log_evaluation(self, prefix: str, loss: float, name: str | None, tensorboard: bool = True) -> None:
        self.hooks.on_evaluate(self, prefix, name, loss)
        self.metrics.log_evaluation(prefix, loss, self.progress, name=name, tensorboard=tensorboard)

    # --- checkpoint and end --------------------------------------------------------------------

    def save(self) -> None:
        began = time.time()
        self.checkpointer.save(self.engine, self.lr_scheduler, self.progress)
        self.budget.save_took(time.time() - began)
        progress, save_dir = self.progress, self.checkpointer.config.save
        if self.metrics.config.log_progress and torch.distributed.get_rank() == 0:
            self._log_progress(progress_log.checkpoint_line(
                save_dir, self.parallel.world_size, progress.iteration, progress.floating_point_operations,
                progress.consumed_train_tokens, self.start_time, self.job_start_operations))

    def _log_progress(self, message: str) -> None:
        """--log-progress: one line of progress.txt in --save, written by global rank 0."""
        if self.metrics.config.log_progress and torch.distributed.get_rank() == 0:
            progress_log.append(self.checkpointer.config.save, self.parallel.world_size, message)

    def finish(self, stop: str) -> None:
        """After training: the final validation, save and test evaluation of a finished run, or the
        save and message of an exit flag, as Megatron does; then the TensorBoard writer closes."""
        progress = self.progress
        unsaved = self.checkpointer.config.save and progress.last_saved_iteration != progress.iteration
        if stop == "finished":
            if self.valid_iters is not None and self.evaluation.eval_iters > 0:
                self.validate("the end of training for val data")
            if unsaved and progress.iteration > 0:
                self.save()
            testing = self.test_iters is not None and self.evaluation.eval_iters > 0
            for name, test_iter in self.test_iters if testing else []:
                loss, _ = self.evaluate(test_iter)
                self._log_evaluation("the end of training for test data", loss, name, tensorboard=False)
        elif self.loss_stop is not None:  # no save: the weights produced the bad loss
            # nor a tracked checkpoint that holds them
            tracked = self.checkpointer.untrack_from(self.weights_iteration)
            before, after = self.loss_stop
            print_rank_0(f"{before}; {tracked}. {after}")
        else:  # --exit-interval / --exit-duration-in-mins / --kill-switch-path / a signal: save and leave
            if unsaved and progress.iteration > 0:  # out of time before the first iteration: nothing to save
                self.save()
            torch.distributed.barrier()
            print_rank_0(f"exiting program at iteration {progress.iteration}")
        self.checkpointer.release_save_dir()
        self.metrics.close()
        if self.loss_stop is not None:
            # every rank leaves (code 3) only now: the launcher ends the others when one exits non-zero
            torch.distributed.barrier()


def _build_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: LRSchedule) -> AnnealingLR:
    """Schedule lengths in samples (iteration-based flags converted with the global batch), or in
    tokens where --lr-warmup-tokens / --lr-decay-tokens give them."""
    return AnnealingLR(optimizer, schedule.max_lr, schedule.min_lr, schedule.warmup_samples, schedule.decay_samples,
                       schedule.decay_style, tokens_per_sample=schedule.tokens_per_sample,
                       warmup_tokens=schedule.warmup_tokens, decay_tokens=schedule.decay_tokens,
                       use_checkpoint_scheduler=schedule.use_checkpoint_scheduler,
                       override_scheduler=schedule.override_scheduler,
                       wsd_decay_samples=schedule.wsd_decay_samples, wsd_decay_tokens=schedule.wsd_decay_tokens,
                       wsd_decay_style=schedule.wsd_decay_style, start_wd=schedule.start_wd,
                       end_wd=schedule.end_wd, wd_incr_samples=schedule.wd_incr_samples,
                       wd_incr_style=schedule.wd_incr_style)


def exit_signals(start_time: float, settings: ExitSettings) -> tuple[bool, bool]:
    """(out of time, kill switch) as stop_flags decides them (used at startup, before training),
    with `start_time` the budget's start and nothing measured yet."""
    minutes = settings.exit_duration_in_mins
    flags = stop_flags(settings, TimeBudget(60 * minutes if minutes else None, start_time, 0.0))
    return flags.late, flags.killed


def stop_flags(settings: ExitSettings, budget: TimeBudget | None = None, received: bool | None = None) -> StopFlags:
    """Every rank's exit flags, decided together: one MAX all-reduce of five floats (the kill
    switch, the signal and the budget's three times, time_budget.py), so one rank that sees the
    --kill-switch-path file, one rank that received a stop signal (`received`)
    or one rank whose times spend --exit-duration-in-mins stops every rank after the same iteration
    (a rank alone in the exit save's barrier would hang the job). No collective when none of these
    is configured; with any, this is the iteration's one extra collective (a file stat per rank with
    a kill switch)."""
    kill_switch, seconds = settings.kill_switch_path, budget.seconds if budget is not None else None
    if not seconds and not kill_switch and received is None:
        return StopFlags()
    times = budget.times() if budget is not None and seconds else (0.0, 0.0, 0.0)
    # float64: the times in seconds keep their milliseconds
    flags = torch.tensor([float(bool(kill_switch) and os.path.exists(kill_switch)), float(bool(received)), *times],
                         dtype=torch.float64)
    if torch.cuda.is_available():
        flags = flags.cuda()
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    killed, signalled, used, iteration, save = flags.tolist()
    late = seconds is not None and out_of_time(seconds, used, iteration, save)
    return StopFlags(late, killed > 0, signalled > 0, (used, iteration, save) if seconds else None)
