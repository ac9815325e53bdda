"""pretrain(): build, then train / evaluate / checkpoint through the DeepSpeed engine.

Model size and FLOPs per sample are computed once in setup_model_and_optimizer (see
megatron/utils.py); the logger below only reads them from args.
"""
import sys
import time

import deepspeed
import torch

from megatron import mpu, print_rank_0
from megatron.arguments import ConfigError
from megatron.checkpointing import check_load_layout, load_checkpoint, save_checkpoint, set_rng_state
from megatron.global_vars import close_tensorboard_writer, get_timers
from megatron.initialize import initialize_megatron
from megatron.learning_rates import AnnealingLR
from megatron.memory_measure import finish_memory_probe, startup_report
from megatron.microbatches import NumMicroBatchesCalculator, num_train_iterations
from megatron.optimizer import build_optimizer, uses_own_clipping
from megatron.training_log import evaluation_log, log_model_size, training_log
from megatron.model.analytic import gigaflos_no_embeds
from megatron.utils import (cache_parameter_counts, compute_parameter_counts, format_parameter_report,
                            parameter_count_mismatches)


def pretrain(train_valid_test_dataset_provider, model_provider, forward_step_func, batch_fn,
             extra_args_provider=None, args_list=None):
    """forward_step_func(batch, model) -> loss for the non-pipeline engine; batch_fn(data) ->
    (inputs, labels) for the pipeline engine."""
    start = time.time()
    args = initialize_megatron(extra_args_provider, args_list)
    if args.load:
        check_load_layout(args)  # a mismatched checkpoint fails before the model is built
    engine, lr_scheduler, calculator = setup_model_and_optimizer(model_provider, args)
    args.iteration, rng_state = load_checkpoint(engine, lr_scheduler, args) if args.load else (0, None)
    calculator.update(args.consumed_train_samples)
    engine.set_train_batch_size(calculator.get_current_global_batch_size())
    train_iter, valid_iter, test_iter = build_data_iterators(train_valid_test_dataset_provider, args, batch_fn)
    if rng_state is not None:  # last: nothing in setup may draw from the RNG after this
        set_rng_state(rng_state)
    print_rank_0(f"time to initialize and build (s): {time.time() - start:.2f}")

    step = _make_train_step(engine, forward_step_func, args)
    evaluate_fn = _make_evaluate(engine, forward_step_func, args)
    if args.train_iters is None or args.iteration < args.train_iters:
        train(step, evaluate_fn, engine, lr_scheduler, calculator, train_iter, valid_iter, args)
    if valid_iter is not None and args.eval_iters > 0:
        evaluation_log("the end of training for val data", evaluate_fn(valid_iter), args)
    if args.save and args.iteration > 0 and args.iteration != args.last_saved_iteration:
        save_checkpoint(args.iteration, engine, lr_scheduler, args)
    if test_iter is not None and args.eval_iters > 0:
        evaluation_log("the end of training for test data", evaluate_fn(test_iter), args, tensorboard=False)
    close_tensorboard_writer()
    return args


# --- build -----------------------------------------------------------------------------------

def setup_model_and_optimizer(model_provider, args):
    model = model_provider(args)
    # the one and only parameter count of the run
    counts = compute_parameter_counts(model, mpu)
    cache_parameter_counts(args, counts)
    for line in format_parameter_report(counts, args.model_shape, args.data_parallel_size,
                                        args.checkpoint_activations):
        print_rank_0(line)
    problems = parameter_count_mismatches(counts, args.model_shape)
    if problems and args.rank == 0:
        print("WARNING: parameter count disagrees with the analytic formula "
              "(megatron.model.analytic.analytic_parameter_counts): " + "; ".join(problems), flush=True)
    log_model_size(args)

    optimizer = build_optimizer(model, args)
    calculator = NumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size,
                                           args.data_parallel_size, args.rampup_batch_size)
    args.total_iterations = num_train_iterations(args)
    lr_scheduler = _build_lr_scheduler(optimizer, args)
    config = dict(args.deepspeed_config_dict)
    if uses_own_clipping(args):
        config["gradient_clipping"] = 0.0  # the optimizer hook clips (see megatron/optimizer.py)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           mpu=None if args.ds_pipeline_enabled else mpu)
    if args.data_parallel_size == 1 and uses_own_clipping(args):
        # fp32, one replica: nothing to average, yet DeepSpeed would flatten every gradient, scale
        # it by 1/1, all-reduce it over one rank and copy it back (~2% of a CPU step)
        engine.enable_backward_allreduce = False             # DeepSpeedEngine.backward
        engine.pipeline_enable_backward_allreduce = False    # PipelineEngine's ReduceGrads
    lr_scheduler.optimizer = engine.optimizer  # DeepSpeed may wrap it; the wrapper owns param_groups
    startup_report(engine, args)  # predicted memory per rank, MFU peak; arms the first iteration's measurement
    lr_scheduler.step(0)
    args.consumed_train_samples = args.consumed_valid_samples = 0
    args.gigaflos_no_embeds = 0.0
    args.last_saved_iteration = None
    return engine, lr_scheduler, calculator


def _train_samples(args):
    return args.train_samples if args.train_samples is not None else args.train_iters * args.global_batch_size


def _build_lr_scheduler(optimizer, args):
    """All schedule lengths in samples; iteration-based flags are converted with the global batch."""
    gbs = args.global_batch_size
    if args.train_iters is not None:
        decay = (args.lr_decay_iters or args.train_iters) * gbs
        warmup = args.lr_warmup_iters * gbs
    else:
        decay = args.lr_decay_samples or args.train_samples
        warmup = args.lr_warmup_samples
    if args.lr_warmup_fraction is not None:
        warmup = int(args.lr_warmup_fraction * decay)
    return AnnealingLR(optimizer, args.lr, args.min_lr, warmup, decay, args.lr_decay_style)


def build_data_iterators(provider, args, batch_fn):
    """Every rank builds the datasets (index caches are written by rank 0 only); the first and
    last pipeline stages (every rank without PP) read batches."""
    from megatron.data.data_samplers import build_pretraining_data_loader

    gbs = args.global_batch_size
    eval_runs = args.total_iterations // args.eval_interval + 1  # periodic ones and the final one
    num_samples = [_train_samples(args), eval_runs * args.eval_iters * gbs, args.eval_iters * gbs]
    datasets = provider(args, num_samples)
    dp_rank, dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
    consumed = [args.consumed_train_samples, args.consumed_valid_samples, 0]
    iterators = []
    for split, (dataset, done) in enumerate(zip(datasets, consumed)):
        if dataset is not None:  # a finished run reloaded with a shorter schedule has nothing left
            done = min(done, len(dataset))
        loader = build_pretraining_data_loader(dataset, done, args.micro_batch_size, dp_rank, dp_size,
                                               args.num_workers)
        if loader is None:
            iterators.append(None)
        else:
            iterators.append(map(batch_fn, iter(loader) if split == 0 else _cycle(loader)))
    return iterators


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

def _make_train_step(engine, forward_step_func, args):
    if args.ds_pipeline_enabled:
        def step(data_iterator):
            return engine.train_batch(data_iter=data_iterator)
        return step

    def step(data_iterator):
        total = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            loss = forward_step_func(next(data_iterator), engine)
            engine.backward(loss)
            engine.step()
            total = total + loss.detach()
        loss = total / engine.gradient_accumulation_steps()
        if args.data_parallel_size > 1:  # report the loss of the whole global batch
            torch.distributed.all_reduce(loss, group=mpu.get_data_parallel_group())
            loss = loss / args.data_parallel_size
        return loss
    return step


def _make_evaluate(engine, forward_step_func, args):
    def evaluate(data_iterator):
        engine.eval()
        total = 0.0
        with torch.no_grad():
            for _ in range(args.eval_iters):
                if args.ds_pipeline_enabled:
                    loss = engine.eval_batch(data_iter=data_iterator)
                else:
                    loss = sum(forward_step_func(next(data_iterator), engine)
                               for _ in range(engine.gradient_accumulation_steps()))
                    loss = loss / engine.gradient_accumulation_steps()
                    if args.data_parallel_size > 1:
                        torch.distributed.all_reduce(loss, group=mpu.get_data_parallel_group())
                        loss = loss / args.data_parallel_size
                total += float(loss)
                args.consumed_valid_samples += args.global_batch_size
        engine.train()
        return total / args.eval_iters
    return evaluate


def train(step, evaluate_fn, engine, lr_scheduler, calculator, train_iter, valid_iter, args):
    timers = get_timers()
    engine.train()
    interval = {"iterations": 0, "samples": 0, "loss": 0.0}
    start_time = time.time()
    while True:
        if args.train_iters is not None and args.iteration >= args.train_iters:
            break
        if args.train_samples is not None and args.consumed_train_samples >= args.train_samples:
            break
        gbs = calculator.get_current_global_batch_size()
        # the interval time covers training steps only, not evaluation or checkpoint saves
        timers("interval-time").start()
        loss = step(train_iter)
        timers("interval-time").stop()
        lr_scheduler.step(gbs)
        args.iteration += 1
        args.consumed_train_samples += gbs
        args.gigaflos_no_embeds += gigaflos_no_embeds(gbs, args.seq_length, args.parameters_no_embedding)
        interval["iterations"] += 1
        interval["samples"] += gbs
        interval["loss"] = interval["loss"] + loss  # a tensor: no host sync until we log
        finish_memory_probe(args)  # once, after the first iteration: measured vs predicted memory

        calculator.update(args.consumed_train_samples)
        if calculator.get_current_global_batch_size() != gbs:
            engine.set_train_batch_size(calculator.get_current_global_batch_size())

        if args.iteration % args.log_interval == 0:
            training_log(interval, timers("interval-time").elapsed(), lr_scheduler, engine, gbs, args)
            interval = {"iterations": 0, "samples": 0, "loss": 0.0}

        if valid_iter is not None and args.eval_interval and args.iteration % args.eval_interval == 0 \
                and args.eval_iters > 0:
            evaluation_log(f"iteration {args.iteration}", evaluate_fn(valid_iter), args)

        if args.save and args.save_interval and args.iteration % args.save_interval == 0:
            save_checkpoint(args.iteration, engine, lr_scheduler, args)

        out_of_time = args.exit_duration_in_mins and (time.time() - start_time) / 60 > args.exit_duration_in_mins
        if (args.exit_interval and args.iteration % args.exit_interval == 0) or out_of_time:
            if args.save and args.last_saved_iteration != args.iteration:
                save_checkpoint(args.iteration, engine, lr_scheduler, args)
            torch.distributed.barrier()
            print_rank_0(f"exiting program at iteration {args.iteration}")
            close_tensorboard_writer()
            sys.exit(0)
