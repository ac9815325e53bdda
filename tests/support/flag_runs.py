"""pretrain_gpt.py's flags for the in-process one-line-error tests (the `entry_point` fixture of
tests/conftest.py runs them): a small valid BASE and edits of it, and the check that a run stopped
with one line naming the flag before the model was built."""

BASE = {"--num-layers": 4, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 32,
        "--max-position-embeddings": 32, "--micro-batch-size": 2, "--global-batch-size": 8, "--train-iters": 10,
        "--lr": 1e-3, "--mock-data": None, "--vocab-size": 600}
VOCAB, MERGES = "data/gpt2-vocab.json", "data/gpt2-merges.txt"
SAMPLES = {"--train-iters": "drop", "--train-samples": 100}  # sample-based training
REAL_DATA = {"--mock-data": "drop", "--vocab-size": "drop", "--vocab-file": VOCAB, "--merge-file": MERGES}


def flags(changes):
    """BASE with `changes` applied: a value replaces (or adds) a flag, "drop" removes it, None is a switch."""
    merged = dict(BASE)
    for flag, value in changes.items():
        if value == "drop":
            merged.pop(flag, None)
        else:
            merged[flag] = value
    out = []
    for flag, value in merged.items():
        out.append(flag)
        if value is not None:
            out += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return out


def check_one_line(entry_point, args_list, world_size, flag):
    code, lines, builds = entry_point(args_list, world_size)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("pretrain_gpt.py: error: "), lines
    assert flag in lines[0], lines[0]
    assert builds == [], "the model was built before the error"
    return lines[0]
