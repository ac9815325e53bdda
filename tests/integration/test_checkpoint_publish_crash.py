"""A save killed at every step of its publication (megatron/checkpoint/writer.py): the manifest's
rename, the renames that put global_stepN in place and the two tracker files. A forked process
saves with os.rename / os.replace made to SIGKILL it just before the k-th call, for every k until
one save completes; then the restart's cleanup (remove_stale, run under the save directory's lock
at startup) runs. Every time, the tracker names a complete checkpoint whose files match its
manifest, and nothing a crash left remains. The re-save of the tracked iteration (a --finetune run
saving at the iteration the tracker names) has one step where neither copy is under its name:
the tracked copy is moved aside just before the new one takes its place."""
import os
import signal

import pytest

from megatron.checkpoint.layout import read_tracker, step_dir
from megatron.checkpoint.manifest import read_manifest, verify_share
from megatron.checkpoint.writer import remove_stale, write_iteration


def _save(save_dir, iteration, version):
    def write_shards(tag):  # what DeepSpeed's save_checkpoint writes, one file here
        os.makedirs(os.path.join(save_dir, tag))
        with open(os.path.join(save_dir, tag, "shard.bin"), "w") as f:
            f.write(version)

    def write_ours(directory):
        with open(os.path.join(directory, "ours.json"), "w") as f:
            f.write("{}")
    write_iteration(save_dir, iteration, write_shards, write_ours)


def _killed_save(save_dir, iteration, version, k):
    """The save in a forked process that dies (SIGKILL, no cleanup) instead of making its k-th
    rename; True when it was killed, False when it completed."""
    pid = os.fork()
    if pid == 0:
        calls = [0]

        def dying(real):
            def call(*args, **kwargs):
                if calls[0] == k:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
                return real(*args, **kwargs)
            return call
        os.rename, os.replace = dying(os.rename), dying(os.replace)
        try:
            _save(save_dir, iteration, version)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0
    return False


@pytest.mark.parametrize("new_iteration", [6, 4], ids=["next-iteration", "re-save-of-the-tracked-one"])
def test_a_save_killed_at_any_rename_leaves_a_complete_tracked_checkpoint(tmp_path, new_iteration):
    restored = 0
    for k in range(20):
        save_dir = str(tmp_path / f"kill{k}")
        os.makedirs(save_dir)
        _save(save_dir, 4, "iteration 4, first save")
        killed = _killed_save(save_dir, new_iteration, f"iteration {new_iteration}, second save", k)
        done = remove_stale(save_dir)  # the restarted run, under the save directory's lock
        restored += sum(line.startswith("restored ") for line in done)
        tracked = read_tracker(save_dir, "test")
        # the tracker file is the last thing a save replaces
        assert tracked == (4 if killed else new_iteration), k
        step = step_dir(save_dir, tracked)
        assert os.path.isdir(step), (k, done)
        assert verify_share(step, read_manifest(step), 0, 1) is None, k
        with open(os.path.join(step, "shard.bin")) as f:
            version = f.read()
        if tracked == 4 and new_iteration == 6:
            assert version == "iteration 4, first save", k
        assert not [n for n in os.listdir(save_dir) if ".partial" in n or ".replaced" in n], (k, done)
        if not killed:
            break
    else:
        pytest.fail("the save never completed")
    # calls: the manifest, [final aside], partial -> final, `latest`, the tracker
    assert k == (5 if new_iteration == 4 else 4)
    # the crash between the re-save's two directory renames is the one that needs the restore
    assert restored == (1 if new_iteration == 4 else 0)
