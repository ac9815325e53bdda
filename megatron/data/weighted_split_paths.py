"""BigScience's second way to name the data (mutually exclusive with --data-path / --split):
named groups of datasets, each dataset with a blend weight and the fraction range of its documents
to read, given per split inline or in a file:

  --train-weighted-split-paths "TRAIN: 0.3 0:0.9 data/a_text_document, 0.7 0:0.9 data/b_text_document"
  --valid-weighted-split-paths "A: 1 0.9:1 data/a_text_document" "B: 1 0.9:1 data/b_text_document"
  --valid-weighted-split-paths-path FILE   # one line: "NAME: W START:END PATH, ..." "NAME2: ..."

One training group; every validation / test group is evaluated and logged on its own, under its
name. A group of one dataset reads it alone (its weight is not used); a group of several is a
weighted blend, each dataset asked for its share plus Megatron's 0.5% (as --data-path does)."""
from __future__ import annotations

import math
import os
from argparse import Namespace
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from megatron.runtime.refusal import ConfigError, require

if TYPE_CHECKING:  # annotations only: argument validation reads this module without paying for torch
    import torch

SPLITS = ("train", "valid", "test")
FORMAT = '"NAME: WEIGHT START:END PATH, WEIGHT START:END PATH, ..." (START < END, fractions of the documents)'


@dataclass(frozen=True)
class DatasetGroup:
    name: str
    weights: tuple[float, ...]              # one per dataset, as given
    ranges: tuple[tuple[float, float], ...]  # (start, end) fractions of each dataset's documents
    paths: tuple[str, ...]                  # dataset prefixes (PATH.bin / PATH.idx)

    def document_range(self, i: int, num_documents: int) -> tuple[int, int]:
        """[first, last) document of dataset i, rounded as BigScience's get_split_by_range_ does."""
        start, end = self.ranges[i]
        return round(start * num_documents), round(end * num_documents)


def parse_group(text: str, flag: str) -> DatasetGroup:
    """'NAME: W S:E PATH, W S:E PATH' -> DatasetGroup; one line naming `flag` on bad input."""
    name, sep, rest = text.partition(":")
    require(sep and name.strip() and rest.strip(), f"{flag} {text!r}: expected {FORMAT}")
    weights: list[float]
    ranges: list[tuple[float, float]]
    paths: list[str]
    weights, ranges, paths = [], [], []
    for entry in rest.split(","):
        parts = entry.split()
        require(len(parts) == 3,
                f"{flag} {text!r}: {entry.strip()!r} is not 'WEIGHT START:END PATH'; expected {FORMAT}")
        weight_text, span, path = parts
        try:
            weight = float(weight_text)
            start, end = (float(v) for v in span.split(":"))
        except ValueError:
            raise ConfigError(f"{flag} {text!r}: {entry.strip()!r} is not 'WEIGHT START:END PATH' with numbers; "
                              f"expected {FORMAT}") from None
        require(weight >= 0, f"{flag} group {name.strip()}: weight {weight} of {path} is negative")
        require(0 <= start < end <= 1, f"{flag} group {name.strip()}: range {span} of {path} must be START:END "
                                       f"with 0 <= START < END <= 1")
        for suffix in (".bin", ".idx"):
            require(os.path.isfile(path + suffix), f"{flag} group {name.strip()}: {path + suffix} does not exist; "
                                                   f"create it with tools/preprocess_data.py")
        documents = _num_documents(path)
        first, last = round(start * documents), round(end * documents)
        require(last > first, f"{flag} group {name.strip()}: range {span} of {path} holds none of its {documents} "
                              f"documents; widen it")
        weights.append(weight)
        ranges.append((start, end))
        paths.append(path)
    require(sum(weights) > 0, f"{flag} group {name.strip()}: the weights sum to 0")
    return DatasetGroup(name.strip(), tuple(weights), tuple(ranges), tuple(paths))


def _num_documents(path: str) -> int:
    from .indexed_dataset import make_dataset
    return len(make_dataset(path, "mmap", True))  # reads the .idx header and arrays only


def read_groups_file(path: str, flag: str) -> list[str]:
    """The -path form: a file of one line, each group in double quotes, separated by spaces."""
    require(os.path.isfile(path), f"{flag} {path}: no such file")
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    require(len(lines) == 1 and lines[0].strip().startswith('"') and lines[0].strip().endswith('"'),
            f'{flag} {path}: expected one line of double-quoted groups, e.g. "NAME: 1 0:1 PATH" "NAME2: ..."')
    return lines[0].strip()[1:-1].split('" "')


def groups_from_args(args: Namespace) -> dict[str, list[DatasetGroup]]:
    """{split: [DatasetGroup]} from the -weighted-split-paths(-path) flags; {} when none is given."""
    groups: dict[str, list[DatasetGroup]] = {}
    for split in SPLITS:
        inline_flag = f"--{split}-weighted-split-paths"
        inline, file = (getattr(args, f"{split}_weighted_split_paths"),
                        getattr(args, f"{split}_weighted_split_paths_path"))
        require(inline is None or file is None, f"{inline_flag} and {inline_flag}-path both given: pick one")
        if file is not None:
            inline, inline_flag = read_groups_file(file, f"{inline_flag}-path"), f"{inline_flag}-path {file}:"
        if inline is not None:
            require(inline, f"{inline_flag} needs at least one group {FORMAT}")
            groups[split] = [parse_group(text, inline_flag) for text in inline]
            names = [g.name for g in groups[split]]
            require(len(set(names)) == len(names), f"{inline_flag}: group names repeat ({', '.join(names)})")
    if groups:
        require("train" in groups, "--valid/--test-weighted-split-paths need --train-weighted-split-paths(-path)")
        require(len(groups["train"]) == 1, f"--train-weighted-split-paths takes one group, got "
                                           f"{len(groups['train'])} ({', '.join(g.name for g in groups['train'])})")
    return groups


def build_group_dataset(group: DatasetGroup, split: str, num_samples: int, seq_length: int, seed: int,
                        data_impl: str = "mmap", cache_path: str | None = None) -> torch.utils.data.Dataset:
    """The group's dataset of `num_samples` samples: the one dataset's range, or a weighted blend."""
    from .blendable_dataset import BlendableDataset
    from .gpt_dataset import BLEND_OVERSAMPLE, GPTDataset
    from .indexed_dataset import make_dataset

    total = sum(group.weights)
    shares = [w / total for w in group.weights]
    datasets = []
    for i, path in enumerate(group.paths):
        indexed = make_dataset(path, data_impl, True)
        first, last = group.document_range(i, len(indexed))  # not empty: checked by parse_group
        wanted = (num_samples if len(group.paths) == 1
                  else int(math.ceil(num_samples * shares[i] * BLEND_OVERSAMPLE)))
        documents = np.arange(first, last, dtype=np.int64)
        datasets.append(GPTDataset(split, path, documents, indexed, wanted, seq_length, seed, cache_path))
    if len(datasets) == 1:
        return datasets[0]
    return BlendableDataset(datasets, shares, num_samples)


def build_datasets(
    groups: dict[str, list[DatasetGroup]], train_valid_test_num_samples: Sequence[int], seq_length: int, seed: int,
    data_impl: str = "mmap", cache_path: str | None = None,
) -> tuple[torch.utils.data.Dataset | None, list[tuple[str, torch.utils.data.Dataset]] | None,
           list[tuple[str, torch.utils.data.Dataset]] | None]:
    """(train dataset, [(name, valid dataset)] or None, [(name, test dataset)] or None)."""
    out: list[list[tuple[str, torch.utils.data.Dataset]] | None] = []
    for split, num_samples in zip(SPLITS, train_valid_test_num_samples, strict=True):
        if split not in groups or num_samples <= 0:
            out.append(None)
            continue
        out.append([(g.name, build_group_dataset(g, split, num_samples, seq_length, seed, data_impl, cache_path))
                    for g in groups[split]])
    train = out[0][0][1] if out[0] else None
    return train, out[1], out[2]
