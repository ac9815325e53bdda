"""--mock-data: a synthetic but learnable token stream, so a run needs no dataset.

Every sample walks the same random permutation of the vocabulary from a random start
(token[t+1] = perm[token[t]]), so a bigram model predicts it exactly: a working trainer's loss
falls from log(vocab) towards 0. The permutation depends on the seed alone, so the validation
and test splits (other starts) follow the same rule."""
import numpy as np


class MockGPTDataset:
    def __init__(self, num_samples, seq_length, vocab_size, seed, split=0):
        self.num_samples, self.seq_length, self.seed, self.split = num_samples, seq_length, seed, split
        self.perm = np.random.default_rng(seed).permutation(vocab_size)

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        token = np.random.default_rng([self.seed, self.split, idx]).integers(len(self.perm))
        text = np.empty(self.seq_length + 1, dtype=np.int64)
        for t in range(self.seq_length + 1):
            text[t] = token
            token = self.perm[token]
        return {"text": text}


def build_mock_datasets(train_valid_test_num_samples, seq_length, vocab_size, seed):
    return tuple(MockGPTDataset(n, seq_length, vocab_size, seed, split) if n > 0 else None
                 for split, n in enumerate(train_valid_test_num_samples))
