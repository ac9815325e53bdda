"""A --save directory this run cannot use stops it at startup, before the model is built, in one
line with exit code 2 (megatron/checkpoint/save_dir.py): a path under a regular file (which used to
train to the first save and then hang with two ranks), a read-only mount (where the lock used to be
skipped and the first save died with a traceback on every rank), a full disk, and a disk without
room for one checkpoint of the size this model writes (worked out by hand below). The tests run as
root, where a chmod 0555 directory is still writable: the read-only case is a read-only bind mount,
the full disks are small tmpfs mounts."""
import os
import re
import subprocess

import pytest

from tests.support.launcher import TINY, launch

# TINY's checkpoint, fp32 with Adam, by hand: h = 64, 2 layers of 12 h^2 + 13 h, the final norm
# (2 h), the word embeddings of the vocab padded to 640 (600 up to a multiple of 128) and 32
# positions; 28 tensors (12 per layer, the final norm's 2, the 2 embeddings)
PARAMS = 2 * (12 * 64 ** 2 + 13 * 64) + 2 * 64 + 640 * 64 + 32 * 64
CHECKPOINT_BYTES = 4 * PARAMS + 8 * PARAMS + 4 * 28  # weights; Adam's exp_avg and exp_avg_sq; AdamW's step tensors


def test_a_save_path_under_a_regular_file_stops_both_ranks_in_one_line(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    save = tmp_path / "file" / "ckpt"
    proc, _ = launch(2, TINY + ["--pipeline-model-parallel-size", 2, "--global-batch-size", 2, "--train-iters", 4,
                                "--save-interval", 2, "--save", save], str(tmp_path / "out"), timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if "error" in line.lower()]
    assert errors == [f"pretrain_gpt.py: error: --save {save}: cannot create it (Not a directory: {save}); point "
                      f"--save at a directory this run can create and write"], errors
    assert "Traceback" not in proc.stdout and "estimated model parameters" not in proc.stdout  # before the model
    assert (tmp_path / "file").read_text() == "not a directory"


def test_the_room_is_for_every_ranks_share_of_one_checkpoint(tmp_path):
    """DP=2, fp32, ZeRO 1: the first DP rank saves the weights, each DP rank its half of the fp32
    state. By hand: the weights 4 x PARAMS; each rank's partition, 141,312 matrix and 1,792 other
    elements (two param groups, each a multiple of 2 x DP) halved, as master weights, exp_avg and
    exp_avg_sq (12 bytes an element) plus one 4-byte step per group."""
    if os.geteuid() != 0:
        pytest.skip("the tmpfs mount needs root")
    assert 141_312 + 1_792 == PARAMS
    per_rank = 12 * (141_312 + 1_792) // 2 + 2 * 4
    needed = 4 * PARAMS + 2 * per_rank
    small = str(tmp_path / "small")
    os.makedirs(small)
    _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", small)
    try:
        proc, _ = launch(2, TINY + ["--global-batch-size", 4, "--zero-stage", 1, "--train-iters", 2, "--save", small],
                         str(tmp_path / "out"), timeout=120, check=False)
    finally:
        subprocess.run(["umount", small], capture_output=True)
    assert proc.returncode == 2, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"pretrain_gpt.py: error: --save {small}: no room for this "
                                                     f"run's checkpoints: one needs about {needed} bytes "), errors
    assert "estimated model parameters" not in proc.stdout


def _mount(*argv):
    proc = subprocess.run(["mount", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here (mount {' '.join(argv)}: {proc.stderr.strip()})")


def _fill(directory):
    """Writes a file into `directory` until its disk is full."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_an_unusable_save_directory_is_one_line_before_the_model(entry_point, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the mounts need root")
    ro, full, small = (str(tmp_path / name) for name in ("ro", "full", "small"))
    for path in (ro, full, small):
        os.makedirs(path)
    mounted = []
    try:
        _mount("--bind", ro, ro)
        mounted.append(ro)
        _mount("-o", "remount,bind,ro", ro)
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", full)
        mounted.append(full)
        _fill(full)
        _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", small)  # less than one checkpoint (~1.7 MB)
        mounted.append(small)
        fix = "point --save at a directory this run can write, with room for its checkpoints"
        cases = {ro: f"--save {ro}: cannot write there (Read-only file system); {fix}",
                 f"{ro}/sub": f"--save {ro}/sub: cannot create it (Read-only file system: {ro}/sub); point --save at "
                              f"a directory this run can create and write",
                 full: f"--save {full}: cannot write there (No space left on device); {fix}"}
        for save, line in cases.items():
            before = sorted(os.listdir(os.path.dirname(save) if save.endswith("sub") else save))
            code, lines, builds = entry_point([str(f) for f in TINY + ["--train-iters", 2, "--save", save]])
            assert (code, lines, builds) == (2, [f"pretrain_gpt.py: error: {line}"], []), save
            assert sorted(os.listdir(os.path.dirname(save) if save.endswith("sub") else save)) == before
        code, lines, builds = entry_point([str(f) for f in TINY + ["--train-iters", 2, "--save", small]])
        assert code == 2 and len(lines) == 1 and builds == [], lines
        match = re.fullmatch(rf"pretrain_gpt.py: error: --save {small}: no room for this run's checkpoints: one needs "
                             rf"about {CHECKPOINT_BYTES} bytes \(the weights and optimizer state its ranks save "
                             rf"there, predicted\), (\d+) bytes are free; free some space or point --save at a larger "
                             rf"disk", lines[0])
        assert match, lines[0]
        # free then: free now less the lock (one page) the run held while it checked
        assert 0 < os.statvfs(small).f_bavail * os.statvfs(small).f_frsize - int(match.group(1)) <= 8192
        assert os.listdir(small) == []  # the lock given back
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", path], capture_output=True)
