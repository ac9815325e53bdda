"""Weighted mix of several datasets, drawn in a fixed interleaved order."""
from collections.abc import Sequence

import numpy as np
import torch

from . import helpers


class BlendableDataset(torch.utils.data.Dataset):
    """`size` samples from `datasets`, each contributing its weighted share.

    Sample k comes from datasets[dataset_index[k]] at position
    dataset_sample_index[k]; each dataset is read in its own (already
    shuffled) order, so the blend needs no shuffle of its own.
    """

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float] | np.ndarray,
                 size: int) -> None:
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(
                f"BlendableDataset needs one weight per dataset, "
                f"got {len(datasets)} datasets and {len(weights)} weights"
            )
        weights = np.asarray(weights, dtype=np.float64)
        if (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(
                f"--data-path weights must be non-negative with a positive sum, got {weights.tolist()}"
            )
        self.datasets = datasets
        self.size = size
        self.dataset_index, self.dataset_sample_index = helpers.build_blending_indices(
            weights / weights.sum(), size
        )
        for i, dataset in enumerate(datasets):
            needed = np.count_nonzero(self.dataset_index == i)
            available = len(dataset)  # type: ignore[arg-type]  # our datasets have a length
            if needed > available:
                raise ValueError(f"blended dataset {i} has {available} samples but its weight needs {needed}")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        dataset = self.datasets[self.dataset_index[idx]]
        return dataset[self.dataset_sample_index[idx]]
