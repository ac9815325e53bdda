"""Argonne's --data-file-list (its AuroraGPT launchers pass their data this way): a text file with
one dataset per line, `WEIGHT PREFIX CORPUS`, e.g.

    0.0031025147279277244 /data/dolma/books-0000_text_document books
    0.0009996745994661548 /data/dolma/books-0002_text_document books

read into --data-path's weight/prefix pairs: the same weighted blend, each dataset its weight's share
(Argonne's own loader gives each file that share too; it also groups the files of a corpus and
orders their samples by corpus, which --shuffle-sample-in-corpus and --blend-sample-in-corpus change:
that order is not reproduced here, the corpus column is read and not used). Blank lines are
skipped; a trailing .bin on a prefix is dropped, as the fork does. Torch-free."""
import math
import os

from megatron.runtime.refusal import ConfigError

FORMAT = "WEIGHT PREFIX CORPUS (a number, a dataset prefix, a corpus name)"


def read_data_file_list(path: str) -> list[str]:
    """["w1", "prefix1", "w2", "prefix2", ...] (--data-path's form); a missing file or a bad line
    is one line naming the file and the line number."""
    if not os.path.isfile(path):
        raise ConfigError(f"--data-file-list {path}: no such file")
    pairs: list[str] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            where = f"--data-file-list {path} line {number}"
            if len(fields) not in (2, 3):  # the fork requires the corpus; a line without it is still clear
                raise ConfigError(f"{where}: '{line.strip()}' is not {FORMAT}")
            try:
                weight = float(fields[0])
            except ValueError:
                weight = -1.0
            if not (math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"{where}: weight '{fields[0]}' is not a non-negative number ({FORMAT})")
            prefix = fields[1][:-len(".bin")] if fields[1].endswith(".bin") else fields[1]
            pairs += [fields[0], prefix]
    if not pairs:
        raise ConfigError(f"--data-file-list {path}: lists no dataset ({FORMAT}, one per line)")
    if sum(float(w) for w in pairs[0::2]) <= 0:
        raise ConfigError(f"--data-file-list {path}: the weights sum to 0; give at least one a positive weight")
    return pairs
