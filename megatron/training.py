"""pretrain(): build, then train / evaluate / checkpoint through the DeepSpeed engine.

Model size and FLOPs per sample are computed once in setup_model_and_optimizer (see
megatron/utils.py); the logger only reads them.
"""
import os
import time

import deepspeed
import torch

from megatron import mpu, print_rank_0
from megatron.arguments import ConfigError
from megatron.checkpointing import check_load_layout, load_checkpoint, save_checkpoint, set_rng_state
from megatron.engine import current_loss_scale, engine_steps
from megatron.global_vars import close_tensorboard_writer, get_timers
from megatron.grad_stats import ZeroCounter, params_norm
from megatron.initialize import initialize_megatron
from megatron.learning_rates import AnnealingLR, schedule_lengths
from megatron.memory_measure import finish_memory_probe, startup_report
from megatron.microbatches import NumMicroBatchesCalculator, num_train_iterations, run_length
from megatron.model.analytic import gigaflos_no_embeds
from megatron.engine import pop_moe_loss
from megatron.mpu.tp_sync import install_tp_duplicate_sync
from megatron.skip_iterations import skip_iteration, skipped_range
from megatron.optimizer import build_optimizer, uses_own_clipping
from megatron.optimizer_states import log_optimizer_states, optimizer_state_norms
from megatron.training_log import IntervalStats, evaluation_log, log_model_size, training_log
from megatron.training_state import TrainingProgress
from megatron.utils import (cache_parameter_counts, check_parameter_counts, compute_parameter_counts,
                            format_parameter_report)


def pretrain(train_valid_test_dataset_provider, model_provider, forward_step_func, batch_fn,
             extra_args_provider=None, args_list=None):
    """forward_step_func(batch, model) -> loss for the non-pipeline engine; batch_fn(data) ->
    (inputs, labels) for the pipeline engine. Returns (args, progress) when the run ends."""
    start = time.time()
    args = initialize_megatron(extra_args_provider, args_list)
    if exit_signals(start, args)[1]:  # BigScience: a kill switch present at startup ends the job at once
        print_rank_0(f"Detected kill switch at {args.kill_switch_path}. Exiting")
        close_tensorboard_writer()
        return args, TrainingProgress()
    if args.load:
        check_load_layout(args)  # a mismatched checkpoint fails before the model is built
    engine, lr_scheduler, calculator = setup_model_and_optimizer(model_provider, args)
    progress = TrainingProgress()
    rng_state = load_checkpoint(engine, lr_scheduler, progress, args) if args.load else None
    calculator.update(progress.consumed_train_samples)
    engine.set_train_batch_size(calculator.get_current_global_batch_size())
    train_iter, valid_iters, test_iters = build_data_iterators(train_valid_test_dataset_provider, args, progress,
                                                            batch_fn)
    if rng_state is not None:  # last: nothing in setup may draw from the RNG after this
        set_rng_state(rng_state)
    print_rank_0(f"time to initialize and build (s): {time.time() - start:.2f}")

    steps = engine_steps(engine, forward_step_func, args)
    stop = "finished"
    if args.train_iters is None or progress.iteration < args.train_iters:
        stop = train(steps, lr_scheduler, calculator, train_iter, valid_iters, progress, args)
    if stop == "finished":
        if valid_iters is not None and args.eval_iters > 0:
            validate(steps, valid_iters, calculator, progress, args, "the end of training for val data")
        if args.save and progress.iteration > 0 and progress.iteration != progress.last_saved_iteration:
            save_checkpoint(engine, lr_scheduler, progress, args)
        for name, test_iter in test_iters if test_iters is not None and args.eval_iters > 0 else []:
            loss, _ = evaluate(steps, test_iter, calculator, args)
            evaluation_log("the end of training for test data", loss, progress, args, tensorboard=False, name=name)
    else:  # --exit-interval / --exit-duration-in-mins / --kill-switch-path: save and leave, as Megatron does
        if args.save and progress.last_saved_iteration != progress.iteration:
            save_checkpoint(engine, lr_scheduler, progress, args)
        torch.distributed.barrier()
        print_rank_0(f"exiting program at iteration {progress.iteration}")
    close_tensorboard_writer()
    return args, progress


# --- build -----------------------------------------------------------------------------------

def setup_model_and_optimizer(model_provider, args):
    model = model_provider(args)
    if args.sync_tp_duplicated_parameters:
        install_tp_duplicate_sync(model, mpu)
    # the one and only parameter count of the run
    counts = compute_parameter_counts(model, mpu, args.model_shape)  # stops on a parameter the table lacks
    check_parameter_counts(counts, args.model_shape)  # stops on a count that differs from the table's
    cache_parameter_counts(args, counts)
    report = format_parameter_report(counts, args.model_shape, args.data_parallel_size, args.checkpoint_activations,
                                     args.activations_checkpoint_method, args.checkpoint_num_layers)
    for line in report:
        print_rank_0(line)
    log_model_size(args, report)

    optimizer = build_optimizer(model, args)
    # --log-num-zeros-in-grad: counted in a pre-step hook (after the clipping hook); read by train()
    args.grad_zero_counter = ZeroCounter(optimizer, model, mpu) if args.log_num_zeros_in_grad else None
    calculator = NumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size,
                                           args.data_parallel_size, args.rampup_batch_size)
    args.total_iterations = num_train_iterations(args)
    lr_scheduler = _build_lr_scheduler(optimizer, args)
    config = dict(args.deepspeed_config_dict)
    if uses_own_clipping(args):
        config["gradient_clipping"] = 0.0  # the optimizer hook clips (see megatron/optimizer.py)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           mpu=None if args.ds_pipeline_enabled else mpu)
    if args.data_parallel_size == 1 and uses_own_clipping(args) and not args.model_shape.is_moe:
        # fp32, one replica: nothing to average, yet DeepSpeed would flatten every gradient, scale
        # it by 1/1, all-reduce it over one rank and copy it back (~2% of a CPU step)
        engine.enable_backward_allreduce = False             # DeepSpeedEngine.backward
        engine.pipeline_enable_backward_allreduce = False    # PipelineEngine's ReduceGrads
    if args.model_shape.is_moe:
        # every pipeline stage takes DeepSpeed's MoE checkpoint path, also one without an MoE layer:
        # its per-layer path would end the load with a tied-weight broadcast the others never join
        engine.has_moe_layers = True
    lr_scheduler.optimizer = engine.optimizer  # DeepSpeed may wrap it; the wrapper owns param_groups
    startup_report(engine, args)  # predicted memory per rank, MFU peak; arms the first iteration's measurement
    lr_scheduler.step(0)
    return engine, lr_scheduler, calculator


def _build_lr_scheduler(optimizer, args):
    """Schedule lengths in samples (iteration-based flags converted with the global batch), or in
    tokens where --lr-warmup-tokens / --lr-decay-tokens give them."""
    (warmup, decay), (warmup_tokens, decay_tokens) = schedule_lengths(args)
    return AnnealingLR(optimizer, args.lr, args.min_lr, warmup, decay, args.lr_decay_style,
                       tokens_per_sample=args.seq_length, warmup_tokens=warmup_tokens, decay_tokens=decay_tokens,
                       use_checkpoint_scheduler=args.use_checkpoint_opt_param_scheduler,
                       override_scheduler=args.override_opt_param_scheduler)


def _train_samples(args):
    """Samples the training split is sized for (--train-tokens: what the run consumes up to it)."""
    if args.train_tokens is not None:
        return run_length(args)[1]
    return args.train_samples if args.train_samples is not None else args.train_iters * args.global_batch_size


def build_data_iterators(provider, args, progress, batch_fn):
    """Every rank builds the datasets (index caches are written by rank 0 only); the first and
    last pipeline stages (every rank without PP) read batches. Returns the training iterator and,
    for validation and test, a list of (group name, iterator): one unnamed entry for --data-path,
    one per group of --valid/--test-weighted-split-paths; None when the split is empty."""
    from megatron.data.data_samplers import build_pretraining_data_loader

    gbs = args.global_batch_size
    eval_runs = args.total_iterations // args.eval_interval + 1  # periodic ones and the final one
    num_samples = [_train_samples(args), eval_runs * args.eval_iters * gbs, args.eval_iters * gbs]
    datasets = provider(args, num_samples)
    dp_rank, dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
    # every validation group resumes at the same position: each evaluation reads the same number
    # of samples from each group
    consumed = [progress.consumed_train_samples, progress.consumed_valid_samples, 0]
    iterators = []
    for split, (named, done) in enumerate(zip(datasets, consumed)):
        named = named if isinstance(named, list) else [(None, named)]
        workers = args.valid_num_workers if split == 1 and args.valid_num_workers is not None else args.num_workers
        split_iterators = []
        for name, dataset in named:
            # a finished run reloaded with a shorter schedule has nothing left
            position = done if dataset is None else min(done, len(dataset))
            loader = build_pretraining_data_loader(dataset, position, args.micro_batch_size, dp_rank, dp_size,
                                                   workers)
            if loader is not None:
                split_iterators.append((name, map(batch_fn, iter(loader) if split == 0 else _cycle(loader))))
        iterators.append(split_iterators or None)
    train = iterators[0][0][1] if iterators[0] else None
    return train, iterators[1], iterators[2]


def _cycle(loader):
    """Validation / test batches, starting over when exhausted: every resumed run evaluates once
    more at its end than the data was sized for, and held-out data may be read twice."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty and loader.batch_sampler.consumed_samples == 0:  # a whole pass found nothing
            raise ConfigError("the validation / test split holds less than one batch for this rank: "
                              "give it a larger share with --split or lower --micro-batch-size")
        loader.batch_sampler.consumed_samples = 0


# --- train -----------------------------------------------------------------------------------

def train_step(steps, lr_scheduler, calculator, train_iter, progress, args):
    """One iteration: the batch through the engine, then the bookkeeping that follows from it.
    Returns the loss (a tensor: no host sync here) and the global batch it was computed on.

    An fp16 step whose gradients overflowed updates nothing: the LR schedule does not advance and
    the step is counted as skipped. Its samples were consumed and its compute spent, so consumed
    samples and gigaflos advance as for any other iteration (as in Megatron-DeepSpeed)."""
    gbs = calculator.get_current_global_batch_size()
    loss = steps.train_batch(train_iter)
    if steps.engine.was_step_applied():
        lr_scheduler.step(gbs)
    else:
        progress.skipped_iterations += 1
    progress.iteration += 1
    progress.consumed_train_samples += gbs
    progress.consumed_train_tokens += gbs * args.seq_length
    # C = 6 N D with N the parameters a token passes through (the active ones of an MoE model)
    progress.gigaflos_no_embeds += gigaflos_no_embeds(gbs, args.seq_length, args.parameters_active_no_embedding)
    calculator.update(progress.consumed_train_samples)
    if calculator.get_current_global_batch_size() != gbs:
        steps.engine.set_train_batch_size(calculator.get_current_global_batch_size())
    return loss, gbs


def evaluate(steps, data_iterator, calculator, args):
    """Mean loss over --eval-iters batches of the current global batch size, and the samples read."""
    steps.engine.eval()
    total = 0.0
    for _ in range(args.eval_iters):
        total += float(steps.eval_batch(data_iterator))
    steps.engine.train()
    return total / args.eval_iters, args.eval_iters * calculator.get_current_global_batch_size()


def validate(steps, valid_iters, calculator, progress, args, prefix):
    """Evaluate on the validation split (each group of --valid-weighted-split-paths on its own,
    logged under its name); the samples read from each move the saved validation position."""
    for name, valid_iter in valid_iters:
        loss, samples = evaluate(steps, valid_iter, calculator, args)
        evaluation_log(prefix, loss, progress, args, name=name)
    progress.consumed_valid_samples += samples


def exit_signals(start_time, args):
    """(out of time, kill switch), decided together: one MAX all-reduce of both flags, so one rank
    past --exit-duration-in-mins, or one rank that sees the --kill-switch-path file, stops every rank
    after the same iteration (a rank alone in the exit save's barrier would hang the job). No
    collective when neither flag is given; with either, this is the iteration's one extra collective
    (two floats; a file stat per rank)."""
    kill_switch = getattr(args, "kill_switch_path", None)
    if not args.exit_duration_in_mins and not kill_switch:
        return False, False
    late = bool(args.exit_duration_in_mins) and time.time() - start_time > 60 * args.exit_duration_in_mins
    flags = torch.tensor([float(late), float(bool(kill_switch) and os.path.exists(kill_switch))])
    if torch.cuda.is_available():
        flags = flags.cuda()
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return bool(flags[0].item()), bool(flags[1].item())


def train(steps, lr_scheduler, calculator, train_iter, valid_iters, progress, args):
    """Trains until the schedule ends ("finished") or an exit flag fires ("exit-interval",
    "exit-duration", "kill-switch": the file appeared); returns which."""
    timers = get_timers()
    steps.engine.train()
    stats = IntervalStats()
    start_time = time.time()
    announced = set()
    while True:
        if args.train_iters is not None and progress.iteration >= args.train_iters:
            return "finished"
        if args.train_samples is not None and progress.consumed_train_samples >= args.train_samples:
            return "finished"
        if args.train_tokens is not None and progress.consumed_train_tokens >= args.train_tokens:
            return "finished"
        skipped = skipped_range(args.skip_train_iteration_range, progress.iteration + 1)
        if skipped:  # read and drop this iteration's batches (megatron/skip_iterations.py)
            if skipped not in announced:
                announced.add(skipped)
                print_rank_0(f"skipping iterations {progress.iteration + 1} to {skipped[1]} "
                             f"(--skip-train-iteration-range)")
            gbs = calculator.get_current_global_batch_size()
            skip_iteration(calculator, train_iter, progress, args.seq_length)
            if calculator.get_current_global_batch_size() != gbs:
                steps.engine.set_train_batch_size(calculator.get_current_global_batch_size())
            continue
        # the interval time covers training steps only, not evaluation or checkpoint saves
        timers("interval-time").start()
        loss, gbs = train_step(steps, lr_scheduler, calculator, train_iter, progress, args)
        timers("interval-time").stop()
        stats.add(loss, gbs, steps.engine.was_step_applied(), moe_loss=pop_moe_loss())
        finish_memory_probe(args)  # once, after the first iteration: measured vs predicted memory

        if progress.iteration % args.log_interval == 0:
            training_log(stats, timers("interval-time").elapsed(), lr_scheduler.get_lr(),
                         steps.engine.get_global_grad_norm(), current_loss_scale(steps.engine), gbs, progress, args,
                         params_norm=params_norm(steps.engine.module, mpu) if args.log_params_norm else None,
                         num_zeros=args.grad_zero_counter.last if getattr(args, "grad_zero_counter", None) else None)
            if args.log_optimizer_states_to_tensorboard:
                log_optimizer_states(optimizer_state_norms(steps.engine, mpu), progress, args)
            stats = IntervalStats()

        if valid_iters is not None and args.eval_interval and progress.iteration % args.eval_interval == 0 \
                and args.eval_iters > 0:
            validate(steps, valid_iters, calculator, progress, args, f"iteration {progress.iteration}")

        if args.save and args.save_interval and progress.iteration % args.save_interval == 0:
            save_checkpoint(steps.engine, lr_scheduler, progress, args)

        if args.exit_interval and progress.iteration % args.exit_interval == 0:
            return "exit-interval"
        late, killed = exit_signals(start_time, args)
        if killed:
            print_rank_0(f"Detected kill switch at {args.kill_switch_path}. Exiting")
            return "kill-switch"
        if late:
            return "exit-duration"
