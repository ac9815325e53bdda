"""The training run's data: the datasets sized for the run, and one iterator per split that
resumes where the checkpoint's progress says (see Trainer.build_data_iterators)."""
from argparse import Namespace
from collections.abc import Callable, Iterator

from megatron import mpu
from megatron.config.run_config import DataSettings, EvaluationSettings
from megatron.runtime.refusal import ConfigError
from megatron.schedules.progress import TrainingProgress

# validation / test: [(group name or None, iterator)], or None when the split is empty
NamedIterators = list[tuple[str | None, Iterator]] | None


def build_data_iterators(provider: Callable, args: Namespace, data: DataSettings, evaluation: EvaluationSettings,
                         progress: TrainingProgress, batch_fn: Callable, total_iterations: int,
                         train_batch_fn: Callable | None = None
                         ) -> tuple[Iterator | None, NamedIterators, NamedIterators]:
    """Every rank builds the datasets (index caches are written by rank 0 only); the first and
    last pipeline stages (every rank without PP) read batches. Returns the training iterator and,
    for validation and test, a list of (group name, iterator): one unnamed entry for --data-path,
    one per group of --valid/--test-weighted-split-paths; None when the split is empty. `args`
    goes to the provider only (its own flags: --data-path, --split, ...). `train_batch_fn`: the
    training split's own batch_fn (a curriculum cuts training batches only), default batch_fn."""
    from megatron.data.data_samplers import build_pretraining_data_loader

    gbs, eval_iters = data.global_batch_size, evaluation.eval_iters
    eval_runs = total_iterations // evaluation.eval_interval + 1  # periodic ones and the final one
    num_samples = [data.train_samples, eval_runs * eval_iters * gbs, eval_iters * gbs]
    datasets = provider(args, num_samples)
    dp_rank, dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
    # every validation group resumes at the same position: each evaluation reads the same number
    # of samples from each group
    consumed = [progress.consumed_train_samples, progress.consumed_valid_samples, 0]
    iterators: list[NamedIterators] = []
    for split, (named, done) in enumerate(zip(datasets, consumed, strict=True)):
        named = named if isinstance(named, list) else [(None, named)]
        workers = data.valid_num_workers if split == 1 and data.valid_num_workers is not None else data.num_workers
        split_iterators: list[tuple[str | None, Iterator]] = []
        for name, dataset in named:
            # a finished run reloaded with a shorter schedule has nothing left
            position = done if dataset is None else min(done, len(dataset))
            loader = build_pretraining_data_loader(dataset, position, data.micro_batch_size, dp_rank, dp_size,
                                                   workers)
            if loader is not None:
                split_iterators.append((name, map(train_batch_fn or batch_fn, iter(loader)) if split == 0
                                        else map(batch_fn, _cycle(loader))))
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
