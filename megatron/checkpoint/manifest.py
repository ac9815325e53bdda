"""The manifest of one saved iteration: every file of global_stepN with its size and CRC-32,
written at save (DIR/global_stepN/megatron_manifest.json) and checked before a load builds
anything, so a missing, truncated or altered file is one line naming it, not a traceback after
the model is built (or, for a shard altered in place, a run that trains on garbage).

The checksum is CRC-32, computed while the file is written: torch.save writes a zip archive and
computes the CRC-32 of every entry as it writes it (torch.serialization.get_crc32_options(), on
by default), and the archive's directory at the end of the file holds them. The manifest records,
per shard, its size and a CRC-32 over that directory (entry names, sizes and CRC-32s): reading a
few KB per file at save, so the save stays as fast as before (benchmarks/bench_checkpoint.py, the
52M model's 618 MB fp32 + Adam checkpoint: 2.5 ms, where re-reading every byte for a CRC-32 took
0.36 s on a 0.6 s save).
A load checks the sizes, the directories and then every entry's bytes against its CRC-32.
Other files (our JSON) get a CRC-32 of their bytes. Why CRC-32: the manifest guards against
accidents (a crash, a full disk, a bad copy, a flipped block), not tampering, and CRC-32 catches
every burst error up to 32 bits; it is what torch already computes.

Each rank reads its share of the files. Torch-free: tools/verify_checkpoint.py reads it without
building anything.
"""
import json
import os
import zipfile
import zlib
from collections.abc import Iterable

from megatron.runtime.atomic_write import write_atomic
from megatron.runtime.refusal import ConfigError

MANIFEST = "megatron_manifest.json"
ALGORITHM = "crc32"
ZIP, BYTES = "zip entries", "bytes"  # what an entry's CRC-32 is taken over
_CHUNK = 1 << 22  # 4 MiB reads

# what DeepSpeed's readers pick up by pattern: a file like these beside a checkpoint is read with it
_GLOBBED = ("zero_pp_rank_", "_model_states.pt", "_optim_states.pt")


def file_checksum(path: str) -> tuple[int, str]:
    """(size in bytes, CRC-32 of every byte as 8 hex digits) of one file."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, f"{crc:08x}"


def _zip_directory_crc(archive: zipfile.ZipFile) -> str:
    """CRC-32 over the archive's directory: every entry's name, size and CRC-32, in order."""
    text = "".join(f"{i.filename}\0{i.file_size}\0{i.CRC:08x}\n" for i in archive.infolist())
    return f"{zlib.crc32(text.encode()):08x}"


def _entry_crcs_hold(archive: zipfile.ZipFile) -> bool:
    """Whether the writer computed the entries' CRC-32s (torch can be told not to): checked on the
    smallest entry, whose bytes are read."""
    smallest = min(archive.infolist(), key=lambda i: i.file_size, default=None)
    return smallest is not None and zlib.crc32(archive.read(smallest.filename)) == smallest.CRC


def file_entry(path: str) -> dict:
    """The manifest entry of one file, as soon as it is written: a torch.save archive by its
    directory (torch computed the entries' CRC-32s while writing), anything else by its bytes."""
    if path.endswith(".pt"):
        try:
            with zipfile.ZipFile(path) as archive:
                if _entry_crcs_hold(archive):
                    return {"size": os.path.getsize(path), ALGORITHM: _zip_directory_crc(archive), "over": ZIP}
        except (zipfile.BadZipFile, OSError, zlib.error):
            pass  # not a zip archive (torch's legacy format): its bytes
    size, crc = file_checksum(path)
    return {"size": size, ALGORITHM: crc, "over": BYTES}


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
    """{name: manifest entry} of this rank's share of `names` (every world_size-th file)."""
    return {name: file_entry(os.path.join(step_directory, name)) for name in names[rank::world_size]}


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


def _damaged(path: str, kind: str, why: str) -> str:
    return f"{path}: checkpoint {kind} differs from what was saved ({why}); the checkpoint is damaged"


def check_file(path: str, expected: dict) -> str | None:
    """The problem with one file of the manifest (missing, another size, another checksum), as one
    line naming the file (worded as the shard readers' own errors); None when it is as saved."""
    kind = "shard" if path.endswith(".pt") else "file"
    if not os.path.isfile(path):
        return f"{path}: checkpoint {kind} is missing; the checkpoint is incomplete (its manifest lists it)"
    size = os.path.getsize(path)
    if expected.get("over") != ZIP:
        if size != expected["size"]:
            return (f"{path}: checkpoint {kind} has {size} bytes, {expected['size']} were saved (truncated or "
                    f"overwritten); the checkpoint is damaged")
        crc, saved = file_checksum(path)[1], expected[ALGORITHM]
        return None if crc == saved else _damaged(path, kind, f"CRC-32 {crc}, saved {saved}")
    try:
        with zipfile.ZipFile(path) as archive:
            if size != expected["size"]:
                return (f"{path}: checkpoint shard has {size} bytes, {expected['size']} were saved (truncated or "
                        f"overwritten); the checkpoint is damaged")
            if _zip_directory_crc(archive) != expected[ALGORITHM]:
                return _damaged(path, kind, "its zip directory's CRC-32 changed")
            bad = archive.testzip()  # every entry's bytes against the CRC-32 torch wrote with them
    except (zipfile.BadZipFile, OSError, zlib.error) as e:
        return (f"{path}: checkpoint shard is unreadable ({type(e).__name__}); the checkpoint is incomplete or "
                f"corrupt ({size} bytes, {expected['size']} were saved)")
    return None if bad is None else _damaged(path, kind, f"entry {bad} fails its CRC-32")


def check_files(step_directory: str, manifest: dict[str, dict], names: Iterable[str]) -> str | None:
    """The first problem among `names` of the manifest, or None."""
    for name in names:
        problem = check_file(os.path.join(step_directory, name), manifest[name])
        if problem:
            return problem
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
            return (f"{os.path.join(step_directory, extra[0])}: not part of the saved checkpoint (its manifest "
                    f"does not list it), yet DeepSpeed would read it; remove it")
    return check_files(step_directory, manifest, sorted(manifest)[rank::world_size])


def verify_step(step_directory: str) -> tuple[dict[str, dict] | None, str | None]:
    """(manifest or None, first problem or None) of one saved iteration, checked whole by one
    process (tools/verify_checkpoint.py, the converter)."""
    manifest = read_manifest(step_directory)
    return manifest, (verify_share(step_directory, manifest, 0, 1) if manifest is not None else None)
