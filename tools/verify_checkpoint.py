"""Verify a checkpoint directory offline: every file of a saved iteration as its manifest
(global_stepN/megatron_manifest.json) lists it -- present, the same size, the same CRC-32 -- and
no file DeepSpeed's readers would pick up that the checkpoint does not have. The same check a
--load makes before building anything; nothing is written.

  python tools/verify_checkpoint.py DIR [--iteration N]

Exit 0: as saved (or, for a checkpoint written before manifests existed, every .pt file's zip
directory reads: a truncated file is found, a file altered in place is not). Exit 2: one line
naming the damaged file.
"""
import argparse
import os
import zipfile

from megatron.checkpoint.layout import TRACKER, read_layout, read_tracker, require_step_dir
from megatron.checkpoint.manifest import MANIFEST, step_files, verify_step
from megatron.runtime.refusal import ConfigError


def verify(load_dir: str, iteration: int | None) -> str:
    """The line to print for a checkpoint as saved; a ConfigError for anything else."""
    where = f"checkpoint {load_dir}"
    if not os.path.isdir(load_dir):
        raise ConfigError(f"{where}: no such directory")
    if iteration is None:
        iteration = read_tracker(load_dir, where)
        if iteration is None:
            raise ConfigError(f"{where}: {os.path.join(load_dir, TRACKER)} is missing; pass --iteration N")
    step = require_step_dir(load_dir, iteration, where)
    manifest, problem = verify_step(step)
    if problem:
        raise ConfigError(problem)
    read_layout(step, where)  # a layout file this code cannot read is damage too
    if manifest is None:
        for name in step_files(step):
            if name.endswith(".pt"):
                try:
                    zipfile.ZipFile(os.path.join(step, name)).close()
                except (zipfile.BadZipFile, OSError) as e:
                    raise ConfigError(f"{os.path.join(step, name)}: checkpoint shard is unreadable "
                                      f"({type(e).__name__}); the checkpoint is incomplete or corrupt") from None
        return (f"{step}: no {MANIFEST} (saved before manifests existed): every .pt file's zip directory reads; "
                f"contents not verified")
    size = sum(entry["size"] for entry in manifest.values())
    return f"{step}: {len(manifest)} files, {size} bytes, as saved (sizes and CRC-32 match the manifest)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("load", metavar="DIR", help="checkpoint directory (as passed to pretrain_gpt.py --save)")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to verify (default: the tracked one)")
    args = parser.parse_args(argv)
    try:
        print(verify(args.load, args.iteration))
    except ConfigError as e:
        parser.exit(2, f"verify_checkpoint.py: error: {e}\n")


if __name__ == "__main__":
    main()
