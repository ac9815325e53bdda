"""Pretraining batch sampler and data loader that resume exactly where training stopped."""
from collections.abc import Iterator

import torch


def build_pretraining_data_loader(
    dataset: torch.utils.data.Dataset | None, consumed_samples: int, micro_batch_size: int,
    data_parallel_rank: int, data_parallel_size: int, num_workers: int = 0,
) -> torch.utils.data.DataLoader | None:
    """DataLoader yielding {"text": LongTensor [micro_batch_size, seq_length + 1]} for this data-parallel rank."""
    if dataset is None:
        return None
    batch_sampler = MegatronPretrainingSampler(
        total_samples=len(dataset),  # type: ignore[arg-type]  # our datasets have a length
        consumed_samples=consumed_samples,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size=data_parallel_size,
    )
    # its own generator: starting an iterator then draws no number from torch's global RNG, so
    # dropout masks do not depend on when (or how often) loaders are iterated
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=num_workers, pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(0),
    )


class MegatronPretrainingSampler:
    """Global batches of micro_batch_size * data_parallel_size consecutive sample
    indices from consumed_samples on; each rank gets its slice of each.

    Because consumed_samples counts every sample taken by every rank, a run
    resumed from a checkpoint continues with exactly the next global batch.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int, data_parallel_rank: int,
                 data_parallel_size: int, drop_last: bool = True) -> None:
        if total_samples <= 0:
            raise ValueError(f"no samples to draw from (total_samples={total_samples})")
        # consumed == total is a finished run being reloaded: nothing left, which is fine
        if not 0 <= consumed_samples <= total_samples:
            raise ValueError(
                f"consumed_samples={consumed_samples} is outside the dataset's {total_samples} samples; "
                f"the checkpoint has used up this data, so ask for more training samples/iterations or more data"
            )
        if micro_batch_size <= 0 or data_parallel_size <= 0:
            raise ValueError(
                f"micro_batch_size ({micro_batch_size}) and data_parallel_size ({data_parallel_size}) must be positive"
            )
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank {data_parallel_rank} is outside [0, {data_parallel_size})")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        full, partial = divmod(self.total_samples - self.consumed_samples, self.micro_batch_times_data_parallel_size)
        return full + (not self.drop_last and partial > self.data_parallel_rank * self.micro_batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        step = self.micro_batch_times_data_parallel_size
        for global_start in range(self.consumed_samples, self.total_samples, step):
            if self.drop_last and global_start + step > self.total_samples:
                return
            start = global_start + self.data_parallel_rank * self.micro_batch_size
            batch = list(range(start, min(start + self.micro_batch_size, self.total_samples)))
            # Without drop_last the final partial global batch may leave this rank nothing.
            if batch:
                yield batch
