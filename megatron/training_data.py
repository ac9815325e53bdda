"""The training run's data: the datasets sized for the run, and one iterator per split that
resumes where the checkpoint's progress says (see Trainer.build_data_iterators)."""
from argparse import Namespace
from collections.abc import Callable, Iterator

from megatron import mpu
from megatron.arguments import ConfigError
from megatron.microbatches import run_length
from megatron.training_state import TrainingProgress

# validation / test: [(group name or None, iterator)], or None when the split is empty
NamedIterators = list[tuple[str | None, Iterator]] | None


def train_samples(args: Namespace) -> int:
    """Samples the training split is sized for (--train-tokens: what the run consumes up to it)."""
    if args.train_tokens is not None:
        return run_length(args)[1]
    return args.train_samples if args.train_samples is not None else args.train_iters * args.global_batch_size


def build_data_iterators(provider: Callable, args: Namespace, progress: TrainingProgress, batch_fn: Callable,
                         total_iterations: int) -> tuple[Iterator | None, NamedIterators, NamedIterators]:
    """Every rank builds the datasets (index caches are written by rank 0 only); the first and
    last pipeline stages (every rank without PP) read batches. Returns the training iterator and,
    for validation and test, a list of (group name, iterator): one unnamed entry for --data-path,
    one per group of --valid/--test-weighted-split-paths; None when the split is empty."""
    from megatron.data.data_samplers import build_pretraining_data_loader

    gbs = args.global_batch_size
    eval_runs = total_iterations // args.eval_interval + 1  # periodic ones and the final one
    num_samples = [train_samples(args), eval_runs * args.eval_iters * gbs, args.eval_iters * gbs]
    datasets = provider(args, num_samples)
    dp_rank, dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
    # every validation group resumes at the same position: each evaluation reads the same number
    # of samples from each group
    consumed = [progress.consumed_train_samples, progress.consumed_valid_samples, 0]
    iterators: list[NamedIterators] = []
    for split, (named, done) in enumerate(zip(datasets, consumed, strict=True)):
        named = named if isinstance(named, list) else [(None, named)]
        workers = args.valid_num_workers if split == 1 and args.valid_num_workers is not None else args.num_workers
        split_iterators: list[tuple[str | None, Iterator]] = []
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
