"""Writing one saved iteration whole or not at all. Every rank writes into
DIR/global_stepN.partial (a crashed save's leftovers there are removed first); once all have
written, rank 0 adds our JSON files and the manifest (manifest.py), renames the directory to
global_stepN in one step and only then moves the trackers. A rank killed at any point leaves the
previous checkpoint tracked and nothing under a global_stepN name (a re-save of the tracked
iteration killed between its two renames leaves the tracked copy under global_stepN.replaced<pid>,
which the restart renames back: remove_stale); the next save of that
iteration (also on fewer ranks) starts from an empty directory, so no other DP size's files can
end up beside its own.

A run stopped by a loss check moves the trackers back (untrack): the checkpoints whose weights
gave the bad loss are renamed global_stepN.suspect, whole, after the trackers have moved.

A write that fails (a full disk) is agreed by every rank and is one line: the path, the bytes
needed (the last checkpoint's size, from its manifest) and free; the partial directory goes and
the previous checkpoint stays intact and tracked. With the last checkpoint's size known, a disk
without that much room is refused before anything is written.
"""
import contextlib
import os
import re
import shutil
from collections.abc import Callable
from typing import NoReturn

import torch.distributed as dist

from megatron.checkpoint.agree import from_rank_0, gather, rank_and_world
from megatron.checkpoint.layout import LATEST, TRACKER, read_tracker, step_dir, write_tracker
from megatron.checkpoint.manifest import checksum_share, read_manifest, step_files, write_manifest
from megatron.runtime.refusal import ConfigError

PARTIAL = ".partial"  # global_stepN.partial: a save in progress (or a crashed one's leftovers)
_REPLACED = ".replaced"  # global_stepN.replaced<pid>: an untracked global_stepN on its way out
SUSPECT = ".suspect"  # global_stepN.suspect: weights that produced a non-finite or spiky loss, kept


def write_iteration(save_dir: str, iteration: int, write_shards: Callable[[str], None],
                    write_ours: Callable[[str], None]) -> None:
    """Every rank: write_shards(tag) has DeepSpeed write this rank's files under DIR/tag; rank 0:
    write_ours(directory) adds our files. Returns once global_stepN is complete and tracked."""
    final = step_dir(save_dir, iteration)
    partial = final + PARTIAL
    rank, world = rank_and_world()
    problem = from_rank_0(_prepare(save_dir, final, partial) if rank == 0 else None)
    if problem:
        raise ConfigError(problem)
    error = None
    try:
        write_shards(os.path.basename(partial))
        failure = None
    except Exception as e:  # a full disk, a vanished mount: agreed below
        error, failure = e, f"rank {rank}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        if dist.is_initialized():
            dist.barrier()  # the one DeepSpeed's save ends with, which this rank skipped
    failures = [f for f in gather(failure) if f]  # every rank's files are on disk (or not) from here on
    if failures:
        _failed(save_dir, final, partial, failures, error)
    failure = from_rank_0(_rank_0_step(lambda: write_ours(partial)) if rank == 0 else None)
    if failure:
        _failed(save_dir, final, partial, [failure])
    # the manifest: a few KB per file (see manifest.py), the ranks sharing the files
    shares = gather(checksum_share(partial, step_files(partial), rank, world))

    def publish() -> None:
        write_manifest(partial, {name: entry for share in shares for name, entry in share.items()})
        _replace_dir(partial, final)
        write_tracker(save_dir, iteration)
    failure = from_rank_0(_rank_0_step(publish) if rank == 0 else None)
    if failure:
        _failed(save_dir, final, partial, [failure])


def remove_stale(save_dir: str) -> list[str]:
    """Rank 0, holding DIR's lock (no other run writes there): what crashed saves left. A
    global_stepN.replaced<pid> without a global_stepN is the complete checkpoint a crash caught
    between _replace_dir's two renames (a re-save of one iteration, e.g. a --finetune run saving at
    the iteration the tracker names): it is renamed back. The rest is removed. Returns what was done,
    one phrase each."""
    pattern = re.compile(rf"(global_step\d+)({re.escape(PARTIAL)}|{re.escape(_REPLACED)}\d+)")
    names = sorted(os.listdir(save_dir)) if os.path.isdir(save_dir) else []
    stale = [m for m in map(pattern.fullmatch, names) if m]
    done = []
    for match in stale:
        name, final = match.group(0), os.path.join(save_dir, match.group(1))
        if match.group(2) != PARTIAL and not os.path.exists(final):
            os.rename(os.path.join(save_dir, name), final)
            done.append(f"restored {match.group(1)} from {name}")
        else:
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
            done.append(f"removed {name}")
    return done


def untrack(save_dir: str, suspects: list[int], keep: int | None) -> list[str]:
    """Rank 0, holding DIR's lock, after a loss check stopped the run: the trackers point at
    iteration `keep` (both removed when None: no checkpoint older than the suspects is left), then
    each suspect global_stepN is renamed global_stepN.suspect (.suspect2, ... when taken), whole and
    loadable once renamed back, and out of the way of the resumed run's saves of those iterations.
    Trackers first: a crash in between leaves a tracker naming a checkpoint that is there. Returns
    the new names."""
    if keep is None:
        for name in (TRACKER, LATEST):  # the one Megatron reads first
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(save_dir, name))
    else:
        write_tracker(save_dir, keep)
    renamed = []
    for iteration in suspects:
        final = step_dir(save_dir, iteration)
        target, n = final + SUSPECT, 1
        while os.path.exists(target):
            n += 1
            target = f"{final}{SUSPECT}{n}"
        os.rename(final, target)
        renamed.append(os.path.basename(target))
    return renamed


def _rank_0_step(step: Callable[[], None]) -> str | None:
    try:
        step()
    except OSError as e:
        return f"rank 0: {type(e).__name__}: {e}"
    return None


def _replace_dir(partial: str, final: str) -> None:
    """partial becomes final in one rename; an existing final of the same iteration (an untracked
    leftover written before saves went through .partial, or a re-save of one iteration) is moved
    aside first and removed."""
    old = None
    if os.path.exists(final):
        old = f"{final}{_REPLACED}{os.getpid()}"
        os.rename(final, old)
    os.rename(partial, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _prepare(save_dir: str, final: str, partial: str) -> str | None:
    """Rank 0, before anything is written: a crashed save's leftovers of this iteration go; a disk
    without room for a checkpoint as large as the last one is refused (None: go on)."""
    if os.path.isdir(partial):
        shutil.rmtree(partial)
    needed = _last_size(save_dir)
    if needed:
        free = shutil.disk_usage(save_dir).free
        if free < needed:
            return _no_room(save_dir, final, needed, free, "nothing written")
    return None


def _last_size(save_dir: str) -> int | None:
    """The bytes of the tracked checkpoint (what the next one of this run will need), from its
    manifest; None without one."""
    iteration = read_tracker(save_dir, f"--save {save_dir}")
    if iteration is None:
        return None
    try:
        manifest = read_manifest(step_dir(save_dir, iteration))
    except ValueError:
        return None
    return sum(entry["size"] for entry in manifest.values()) if manifest else None


def _kept(save_dir: str) -> str:
    tracked = read_tracker(save_dir, f"--save {save_dir}")
    return f"global_step{tracked} stays the tracked checkpoint" if tracked is not None else "nothing was saved"


def _no_room(save_dir: str, final: str, needed: int, free: int, when: str, at_least: bool = False) -> str:
    size = f"more than {needed} bytes" if at_least else f"about {needed} bytes (the size of the last checkpoint)"
    return (f"--save {save_dir}: no room for {os.path.basename(final)} ({when}): it needs {size}, {free} bytes are "
            f"free; {_kept(save_dir)}; free some space or point --save at a larger disk")


def _failed(save_dir: str, final: str, partial: str, failures: list[str],
            error: BaseException | None = None) -> NoReturn:
    """Every rank: the partial directory goes (rank 0), the trackers stay. A full disk is one line
    (how much room it lacks); anything else unwinds as the error it is (a rank whose own write
    failed raises that error), exiting non-zero with its traceback."""
    seen = None
    if rank_and_world()[0] == 0:
        free = shutil.disk_usage(save_dir).free  # before the clean-up: what the save ran into
        written = 0
        if os.path.isdir(partial):
            written = sum(os.path.getsize(os.path.join(partial, n)) for n in step_files(partial))
            shutil.rmtree(partial, ignore_errors=True)
        seen = (free, written)
    free, written = from_rank_0(seen)
    if free >= (1 << 20) and not any("No space left" in f for f in failures):
        if error is not None:
            raise error
        raise RuntimeError(f"--save {save_dir}: writing {os.path.basename(final)} failed ({failures[0]}); "
                           f"{_kept(save_dir)}")
    last = _last_size(save_dir)
    raise ConfigError(_no_room(save_dir, final, last or written, shutil.disk_usage(save_dir).free,
                               "the disk filled while writing it", at_least=last is None))
