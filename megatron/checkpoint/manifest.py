"""The manifest of one saved iteration: every file of global_stepN with its size and CRC-32,
written at save (DIR/global_stepN/megatron_manifest.json) and checked before a load builds
anything, so a missing, truncated or altered file is one line naming it, not a traceback after
the model is built (or, for a shard altered in place, a run that trains on garbage).

Why CRC-32 (zlib.crc32): the manifest guards against accidents (a crash, a full disk, a bad copy,
a flipped block), not tampering, and CRC-32 catches every burst error up to 32 bits and any change
of length; zlib's is the fastest checksum in the standard library after adler32, whose weak mixing
on short inputs buys too little (benchmarks/bench_checkpoint_manifest.py measures all of them).
Each rank checksums its share of the files right after the save, while they are still in the page
cache. Torch-free: tools/verify_checkpoint.py reads it without building anything.
"""
import json
import os
import zlib
from collections.abc import Iterable

from megatron.atomic_write import write_atomic
from megatron.model.shape import ConfigError

MANIFEST = "megatron_manifest.json"
ALGORITHM = "crc32"
_CHUNK = 1 << 22  # 4 MiB reads: large enough for full speed, small enough to stay in cache

# what DeepSpeed's readers pick up by pattern: a file like these beside a checkpoint is read with it
_GLOBBED = ("zero_pp_rank_", "_model_states.pt", "_optim_states.pt")


def file_checksum(path: str) -> tuple[int, str]:
    """(size in bytes, CRC-32 as 8 hex digits) of one file."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, f"{crc:08x}"


def step_files(step_directory: str) -> list[str]:
    """Every file of a saved iteration (relative paths, sorted; MoE and offload sub-folders
    included), the manifest itself excepted."""
    names = []
    for root, _, files in os.walk(step_directory):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), step_directory)
            if rel != MANIFEST:
                names.append(rel)
    return sorted(names)


def checksum_share(step_directory: str, names: list[str], rank: int, world_size: int) -> dict[str, dict]:
    """{name: {"size", "crc32"}} of this rank's share of `names` (every world_size-th file)."""
    entries = {}
    for name in names[rank::world_size]:
        size, crc = file_checksum(os.path.join(step_directory, name))
        entries[name] = {"size": size, ALGORITHM: crc}
    return entries


def write_manifest(step_directory: str, entries: dict[str, dict]) -> None:
    manifest = {"algorithm": ALGORITHM, "files": dict(sorted(entries.items()))}
    write_atomic(os.path.join(step_directory, MANIFEST), json.dumps(manifest, indent=1))


class ManifestError(ConfigError):
    """A file of a saved iteration that is not as its manifest says (one line naming it)."""


def read_manifest(step_directory: str) -> dict[str, dict] | None:
    """{name: {"size", "crc32"}}, None for a checkpoint written before manifests existed; a
    damaged manifest is one line."""
    path = os.path.join(step_directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
        files = manifest["files"]
        if manifest.get("algorithm") != ALGORITHM or not isinstance(files, dict):
            raise ValueError(manifest.get("algorithm"))
        return files
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{path}: the manifest is unreadable ({type(e).__name__}); the checkpoint cannot be "
                            f"verified (restore the file, or check the shards with tools/verify_checkpoint.py)") \
            from None


def check_files(step_directory: str, manifest: dict[str, dict], names: Iterable[str]) -> str | None:
    """The first problem among `names` of the manifest (missing, another size, another checksum),
    as one line naming the file and the fix; None when they are as saved."""
    for name in names:
        path = os.path.join(step_directory, name)
        expected = manifest[name]
        if not os.path.isfile(path):
            return f"{path} is missing (the manifest lists it); the checkpoint is incomplete"
        size = os.path.getsize(path)
        if size != expected["size"]:
            return (f"{path} has {size} bytes, {expected['size']} were saved (truncated or overwritten); the "
                    f"checkpoint is damaged")
        crc = file_checksum(path)[1]
        if crc != expected[ALGORITHM]:
            return (f"{path} differs from what was saved (CRC-32 {crc}, saved {expected[ALGORITHM]}); the "
                    f"checkpoint is damaged")
    return None


def unlisted_files(step_directory: str, manifest: dict[str, dict]) -> list[str]:
    """Files DeepSpeed's readers would pick up by pattern that the saved checkpoint does not have
    (e.g. another run's DP-rank files copied in)."""
    return [name for name in step_files(step_directory)
            if name not in manifest and any(p in os.path.basename(name) for p in _GLOBBED)]


def verify_share(step_directory: str, manifest: dict[str, dict], rank: int, world_size: int) -> str | None:
    """This rank's share of the check (rank 0 also looks for unlisted files): the first problem, or None."""
    if rank == 0:
        extra = unlisted_files(step_directory, manifest)
        if extra:
            return (f"{os.path.join(step_directory, extra[0])} is not part of the saved checkpoint (its manifest "
                    f"does not list it) and DeepSpeed would read it; remove it")
    return check_files(step_directory, manifest, sorted(manifest)[rank::world_size])


def verify_step(step_directory: str) -> tuple[dict[str, dict] | None, str | None]:
    """(manifest or None, first problem or None) of one saved iteration, checked whole by one
    process (tools/verify_checkpoint.py, the converter)."""
    manifest = read_manifest(step_directory)
    return manifest, (verify_share(step_directory, manifest, 0, 1) if manifest is not None else None)
