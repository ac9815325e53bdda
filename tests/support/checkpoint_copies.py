"""Checkpoint directories copied, fingerprinted and read back by the resume tests."""
import hashlib
import os
import re
import shutil


def digest(directory):
    """Every file's bytes and mode: proof that nothing wrote to a checkpoint."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (hashlib.sha256(f.read()).hexdigest(),
                                                         os.stat(path).st_mtime_ns)
    return out


def checkpoint_at(src, iteration, dst):
    """A checkpoint directory holding only `src`'s iteration `iteration`."""
    shutil.copytree(os.path.join(src, f"global_step{iteration}"), os.path.join(dst, f"global_step{iteration}"))
    for name, text in (("latest", f"global_step{iteration}"), ("latest_checkpointed_iteration.txt", str(iteration))):
        with open(os.path.join(dst, name), "w") as f:
            f.write(text)
    return dst


def log_lines(output):
    """{iteration: (consumed samples, learning rate)} from the Megatron log lines."""
    return {int(m.group(1)): (int(m.group(2)), float(m.group(3))) for m in re.finditer(
        r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) \|.*?learning rate: ([0-9.E+-]+)", output)}
