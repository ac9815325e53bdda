"""--mock-data: a synthetic but learnable token stream, so a run needs no dataset.

Every sample walks one fixed random cycle through CYCLE_LENGTH distinct token ids from a random
starting point. Two things are learnable: which few ids occur at all (the loss drops from
log(vocab) to log(CYCLE_LENGTH) within a few iterations) and the successor of each id (the loss
then falls towards 0). The cycle depends on the seed alone, so the validation and test splits
(other starting points) follow the same rule."""
from collections.abc import Sequence

import numpy as np

CYCLE_LENGTH = 64


class MockGPTDataset:
    def __init__(self, num_samples: int, seq_length: int, vocab_size: int, seed: int, split: int = 0) -> None:
        self.num_samples, self.seq_length, self.seed, self.split = num_samples, seq_length, seed, split
        self.cycle = np.random.default_rng(seed).permutation(vocab_size)[:CYCLE_LENGTH].astype(np.int64)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        start = np.random.default_rng([self.seed, self.split, idx]).integers(len(self.cycle))
        positions = (start + np.arange(self.seq_length + 1)) % len(self.cycle)
        return {"text": self.cycle[positions]}


def build_mock_datasets(train_valid_test_num_samples: Sequence[int], seq_length: int, vocab_size: int,
                        seed: int) -> tuple[MockGPTDataset | None, ...]:
    return tuple(MockGPTDataset(n, seq_length, vocab_size, seed, split) if n > 0 else None
                 for split, n in enumerate(train_valid_test_num_samples))
