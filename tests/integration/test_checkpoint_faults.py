"""Checkpoints a crash cannot poison, one run per save directory, one line for every damaged file,
done the way clusters do it (issue 29).

One bf16 + ZeRO-1 run at DP=2 (the uninterrupted reference, saves at 2, 4 and 6), and the
interrupted history of another: killed (SIGKILL on rank 1, as a lost node) while writing
iteration 4's save, restarted on one rank (DP=1: resharded from 2, saves 4 into the directory
the crash left leftovers for), then resumed back at DP=2 from 4 to 6, while a second run that
tries to write into the same --save directory is refused.

Why not bit-exact against the reference after the restart: iterations 3-4 ran at DP=1, and bf16
rounds a DP=1 step's matmul outputs differently from a DP=2 step's (see test_resume_anywhere.py's
tolerance); the losses before the crash are compared exactly.

Every kind of damage is also refused at 2 ranks (TP1 x PP2) through the `deepspeed` command, with
the exit code 2 a scheduler reads (never 250 from a C++ abort in teardown).
"""
import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from tests.support.checkpoint_copies import checkpoint_at, digest
from tests.support.launch import ROOT, free_port
from tests.support.launcher import TINY, launch, losses

BF16 = TINY + ["--bf16", "--zero-stage", "1", "--global-batch-size", "4", "--train-iters", "6"]
BF16_TOL = 2e-3  # as test_resume_anywhere.py
LOCK = "megatron_save.lock"
MANIFEST = "megatron_manifest.json"


def tracker(ckpt):
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")) as f:
        return f.read()


def verify_tool(*argv):
    return subprocess.run([sys.executable, "tools/verify_checkpoint.py", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))


def in_process(flags, capsys):
    import pretrain_gpt
    capsys.readouterr()
    _, progress = pretrain_gpt.main([str(f) for f in flags])
    return capsys.readouterr().out, progress


def _second_run_while(ckpt, first, release):
    """While `first` (a thread running a launch, held after its build) holds ckpt's lock: what the
    lock says, and a second run of pretrain_gpt.py (one rank, its own process) that would write there."""
    deadline = time.monotonic() + 300
    try:
        while not os.path.exists(os.path.join(ckpt, LOCK)) and first.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not os.path.exists(os.path.join(ckpt, LOCK)):
            return None, None, False  # the first run ended before it took the lock
        with open(os.path.join(ckpt, LOCK)) as f:
            holder = json.load(f)
        env = dict(os.environ, PYTHONPATH=ROOT, DS_ACCELERATOR="cpu", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        second = subprocess.run([sys.executable, "pretrain_gpt.py",
                                 *map(str, TINY + ["--train-iters", 2, "--save", ckpt])],
                                cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        return holder, second, first.is_alive()
    finally:
        open(release, "w").close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    ref, ckpt = str(tmp / "ref"), str(tmp / "ckpt")
    ref_proc, reference = launch(2, BF16 + ["--save", ref, "--save-interval", 2], str(tmp / "ref_out"))
    os.environ["DRIVER_DIE_IN_SAVE"] = "4:1"
    try:
        crashed, _ = launch(2, BF16 + ["--save", ckpt, "--save-interval", 2], str(tmp / "crash_out"), check=False)
    finally:
        del os.environ["DRIVER_DIE_IN_SAVE"]
    partial = os.path.join(ckpt, "global_step4.partial")
    after_crash = {"files": sorted(os.listdir(ckpt)), "tracker": tracker(ckpt),
                   "partial": sorted(os.listdir(partial)) if os.path.isdir(partial) else []}
    # the lock of a run killed with SIGKILL stays behind: the crashed run's, as the kill left it (the
    # test launcher's SIGTERM to rank 0 lets it release its own), or one naming a process that has ended
    if not os.path.exists(os.path.join(ckpt, LOCK)):
        ended = subprocess.Popen(["true"])
        ended.wait()
        with open(os.path.join(ckpt, LOCK), "w") as f:
            json.dump({"host": socket.gethostname(), "pid": ended.pid, "start": "2026-01-01 00:00:00 UTC"}, f)
    with open(os.path.join(ckpt, LOCK)) as f:
        after_crash["lock"] = json.load(f)
    # as if written before manifests existed: loads, unverified, said once
    os.remove(os.path.join(ckpt, "global_step2", MANIFEST))
    restart, restart_ranks = launch(1, BF16 + ["--load", ckpt, "--save", ckpt, "--save-interval", 2,
                                               "--exit-interval", 4], str(tmp / "restart_out"), check=False)
    after_restart = {"files": sorted(os.listdir(ckpt)), "tracker": tracker(ckpt),
                     "step4": sorted(os.listdir(os.path.join(ckpt, "global_step4")))}
    if restart.returncode != 0:
        return {"restart": restart}
    result, release = {}, str(tmp / "release")
    os.environ["DRIVER_HOLD_UNTIL"] = release  # read by the launch's ranks, not by the second run
    back = threading.Thread(target=lambda: result.update(
        zip(("proc", "ranks"), launch(2, BF16 + ["--load", ckpt, "--save", ckpt, "--save-interval", 2],
                                      str(tmp / "back_out"), check=False), strict=True)))
    try:
        back.start()
        holder, second, first_alive = _second_run_while(ckpt, back, release)
    finally:
        back.join()
        del os.environ["DRIVER_HOLD_UNTIL"]
    return {"tmp": tmp, "ref": ref, "ckpt": ckpt, "reference": reference[1], "ref_out": ref_proc.stdout,
            "crashed": crashed,
            "after_crash": after_crash, "restart": restart, "restart_rank": restart_ranks[0],
            "after_restart": after_restart, "back": result["proc"], "back_rank": result["ranks"].get(1),
            "holder": holder, "second": second, "first_alive": first_alive}


def test_a_crash_mid_save_cannot_poison_a_later_checkpoint(runs):
    assert runs["restart"].returncode == 0, runs["restart"].stdout[-3000:]
    assert runs["back"].returncode == 0, runs["back"].stdout[-3000:]
    reference, crash = runs["reference"], runs["after_crash"]
    # killed while writing iteration 4: the tracker stays on 2, the half-written save is only a .partial
    assert runs["crashed"].returncode != 0
    assert crash["tracker"] == "2" and "global_step4" not in crash["files"] and "global_step4.partial" in crash["files"]
    assert any("zero_pp_rank_1_" in name for name in crash["partial"])  # the dead DP rank's leftover
    # the crashed run's losses up to the kill are the reference's, exactly
    crashed_losses = losses(runs["crashed"].stdout)
    assert sorted(crashed_losses) == [1, 2, 3, 4]
    assert crashed_losses == {it: v for it, v in losses(runs["ref_out"]).items() if it <= 4}
    # restarted on one rank (DP=1): resharded from 2, iteration 4 written over the leftovers
    out = runs["restart"].stdout
    assert "resharding weights and optimizer state (DP=2 -> DP=1)" in out
    assert out.count(f"global_step2 has no {MANIFEST} (saved before manifests existed): its files are not "
                     f"verified") == 1
    assert runs["restart_rank"]["iteration"] == 4 and runs["after_restart"]["tracker"] == "4"
    assert not [name for name in runs["after_restart"]["files"] if name.endswith(".partial")]
    step4 = runs["after_restart"]["step4"]
    assert any("zero_pp_rank_0_" in name for name in step4) and not any("zero_pp_rank_1_" in name for name in step4)
    assert MANIFEST in step4
    assert f"--save {runs['ckpt']}: removed global_step4.partial, left by a crashed save" in out
    # the crashed run's lock (its rank 0 died with it) did not block the restart
    assert (f"took over the lock of a run that has ended (host {crash['lock']['host']}, PID {crash['lock']['pid']}"
            in out)
    # back at DP=2 from the DP=1 checkpoint: continues as the uninterrupted run does
    back, rank = runs["back"].stdout, runs["back_rank"]
    assert "resharding weights and optimizer state (DP=1 -> DP=2)" in back
    assert sorted(map(int, rank["losses"])) == [5, 6]
    for it in (5, 6):
        assert rank["losses"][str(it)] == pytest.approx(reference["losses"][str(it)], rel=0, abs=BF16_TOL), it
    assert tracker(runs["ckpt"]) == "6" and not os.path.exists(os.path.join(runs["ckpt"], LOCK))
    proc = verify_tool(runs["ckpt"])
    assert proc.returncode == 0 and proc.stdout.startswith(f"{runs['ckpt']}/global_step6: ")


def test_a_second_run_on_a_save_directory_in_use_stops_in_one_line(runs):
    holder, second = runs["holder"], runs["second"]
    assert holder["host"] == socket.gethostname() and runs["first_alive"]
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert lines[-1] == (f"pretrain_gpt.py: error: --save {runs['ckpt']} is in use by another run (host "
                         f"{holder['host']}, PID {holder['pid']}, started {holder['start']}; lock file "
                         f"{runs['ckpt']}/{LOCK}); give this run another --save directory, or wait for that run "
                         f"to end")
    assert "Traceback" not in second.stderr and "estimated model parameters" not in second.stdout
    # the refused run wrote nothing: the first one's checkpoints are the only ones there
    assert sorted(n for n in os.listdir(runs["ckpt"]) if n.startswith("global_step")) == \
        ["global_step2", "global_step4", "global_step6"]


def _damage(ref, tmp, name, how):
    copy = checkpoint_at(ref, 6, str(tmp / name))
    step = os.path.join(copy, "global_step6")
    how(copy, step)
    return copy, step


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _flip_a_weight(path):
    """One bit of the largest tensor's bytes changed in place (same size, still a valid archive and
    pickle): what a bad disk block or copy does, and what only a checksum sees."""
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(entry.header_offset + 26)  # the local header's name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        f.seek(entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def _old(how):
    """`how`, on a checkpoint as written before manifests existed."""
    def damage(copy, step):
        os.remove(os.path.join(step, MANIFEST))
        how(copy, step)
    return damage


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_every_damaged_file_is_one_line_before_the_model(runs, entry_point, tmp_path):  # noqa: F811
    ref = runs["ref"]
    zero1 = os.path.basename(glob.glob(os.path.join(ref, "global_step6", "*zero_pp_rank_1_*"))[0])
    layer = "layer_01-model_00-model_states.pt"
    # each: the damage, and how the one line starts (after "pretrain_gpt.py: error: ")
    cases = {
        "truncated": (lambda d, s: _truncate(os.path.join(s, zero1)),
                      lambda d, s: f"{s}/{zero1}: checkpoint shard is unreadable (BadZipFile); the checkpoint is "
                                   f"incomplete or corrupt ({os.path.getsize(os.path.join(s, zero1))} bytes, "),
        "missing": (lambda d, s: os.remove(os.path.join(s, layer)),
                    lambda d, s: f"{s}/{layer}: checkpoint shard is missing; the checkpoint is incomplete (its "
                                 f"manifest lists it)"),
        "altered": (lambda d, s: _flip_a_weight(os.path.join(s, layer)),
                    lambda d, s: f"{s}/{layer}: checkpoint shard differs from what was saved (entry "),
        "foreign": (lambda d, s: shutil.copy(os.path.join(s, zero1), os.path.join(s, zero1.replace("_1_", "_2_"))),
                    lambda d, s: f"{s}/{zero1.replace('_1_', '_2_')}: not part of the saved checkpoint (its "
                                 f"manifest does not list it), yet DeepSpeed would read it; remove it"),
        "tracker": (lambda d, s: _write(os.path.join(d, "latest_checkpointed_iteration.txt"), "5"),
                    lambda d, s: f"--load {d}: {d}/global_step5 does not exist (saved iterations: 6)"),
        "manifest": (lambda d, s: _truncate(os.path.join(s, MANIFEST)),
                     lambda d, s: f"--load {d}: {s}/{MANIFEST}: the manifest is unreadable (JSONDecodeError)"),
        # written before manifests existed: the layout file and the shards are still checked
        "layout": (_old(lambda d, s: _truncate(os.path.join(s, "megatron_layout.json"))),
                   lambda d, s: f"--load {d}: {s}/megatron_layout.json is unreadable (JSONDecodeError: "),
        "old_truncated": (_old(lambda d, s: _truncate(os.path.join(s, zero1))),
                          lambda d, s: f"{s}/{zero1}: checkpoint shard is unreadable (BadZipFile); the checkpoint is "
                                       f"incomplete or corrupt"),
        "old_leftover": (_old(lambda d, s: shutil.copy(os.path.join(s, zero1),
                                                       os.path.join(s, zero1.replace("_1_", "_2_")))),
                         lambda d, s: f"{s}/{zero1.replace('_1_', '_2_')}: not part of this checkpoint, which was "
                                      f"saved at DP=2 (a leftover of a crashed save at another DP size); remove it"),
    }
    for name, (how, message) in cases.items():
        copy, step = _damage(ref, tmp_path, name, how)
        before = digest(copy)
        code, lines, builds = entry_point([str(f) for f in BF16 + ["--load", copy]])
        assert code == 2 and len(lines) == 1 and builds == [], (name, lines)
        assert lines[0].startswith(f"pretrain_gpt.py: error: {message(copy, step)}"), (name, lines[0])
        assert digest(copy) == before, name  # nothing changed on disk
        if name != "old_leftover":  # the offline tool says the same (without a manifest it cannot see extras)
            proc = verify_tool(copy)
            body = message(copy, step).replace(f"--load {copy}: ", "")  # the tool names the directory its own way
            assert proc.returncode == 2 and body in proc.stderr, (name, proc.stderr)
            assert proc.stderr.startswith("verify_checkpoint.py: error: ") and proc.stderr.count("\n") == 1



PP2 = TINY + ["--global-batch-size", 4, "--train-iters", 4, "--eval-iters", 0, "--pipeline-model-parallel-size", 2]


@pytest.fixture(scope="module")
def pp2_checkpoint(tmp_path_factory):
    """Iteration 2 of a TP1 x PP2 run."""
    tmp = tmp_path_factory.mktemp("pp2")
    launch(2, PP2 + ["--train-iters", 2, "--save", tmp / "ref"], str(tmp / "ref_out"))
    return str(tmp / "ref")


SHARD, LAYER, OTHER_LAYER = ("mp_rank_01_model_states.pt", "layer_01-model_00-model_states.pt",
                             "layer_02-model_00-model_states.pt")
FOREIGN = "mp_rank_02_model_states.pt"  # a third pipeline stage's file, which DeepSpeed would count
# each: the damage, and how the one line starts (after "pretrain_gpt.py: error: "); the ranks split
# the manifest's files (rank 1 checks SHARD and LAYER, rank 0 OTHER_LAYER; rank 0 alone looks for
# files the manifest does not list)
PP2_DAMAGE = {
    "truncated": (lambda d, s: _truncate(os.path.join(s, SHARD)),
                  lambda d, s: f"{s}/{SHARD}: checkpoint shard is unreadable (BadZipFile)"),
    "missing": (lambda d, s: os.remove(os.path.join(s, OTHER_LAYER)),
                lambda d, s: f"{s}/{OTHER_LAYER}: checkpoint shard is missing"),
    "altered": (lambda d, s: _flip_a_weight(os.path.join(s, LAYER)),
                lambda d, s: f"{s}/{LAYER}: checkpoint shard differs from what was saved (entry "),
    "foreign": (lambda d, s: shutil.copy(os.path.join(s, SHARD), os.path.join(s, FOREIGN)),
                lambda d, s: f"{s}/{FOREIGN}: not part of the saved checkpoint"),
    "tracker": (lambda d, s: _write(os.path.join(d, "latest_checkpointed_iteration.txt"), "5"),
                lambda d, s: f"--load {d}: {d}/global_step5 does not exist (saved iterations: 2)"),
    "garbled_tracker": (lambda d, s: _write(os.path.join(d, "latest_checkpointed_iteration.txt"), "two"),
                        lambda d, s: f"--load {d}: latest_checkpointed_iteration.txt holds 'two'"),
    "manifest": (lambda d, s: _truncate(os.path.join(s, MANIFEST)),
                 lambda d, s: f"--load {d}: {s}/{MANIFEST}: the manifest is unreadable (JSONDecodeError)"),
    "layout": (_old(lambda d, s: _truncate(os.path.join(s, "megatron_layout.json"))),
               lambda d, s: f"--load {d}: {s}/megatron_layout.json is unreadable (JSONDecodeError: "),
    "old_truncated": (_old(lambda d, s: _truncate(os.path.join(s, SHARD))),
                      lambda d, s: f"{s}/{SHARD}: checkpoint shard is unreadable (BadZipFile)"),
    "old_missing": (_old(lambda d, s: os.remove(os.path.join(s, LAYER))),
                    lambda d, s: f"{s}/{LAYER}: checkpoint shard is missing"),
}


def _damaged_pp2(ref, tmp_path, name):
    """A copy of `ref` with PP2_DAMAGE[name] done to it: (copy, its digest, the expected line's start)."""
    how, message = PP2_DAMAGE[name]
    copy = checkpoint_at(ref, 2, str(tmp_path / name))
    step = os.path.join(copy, "global_step2")
    how(copy, step)
    return copy, digest(copy), f"pretrain_gpt.py: error: {message(copy, step)}"


def _error_lines(output):
    return [line for line in output.splitlines() if line.startswith("pretrain_gpt.py: error: ")]


def test_every_damaged_file_at_two_ranks_is_one_line_and_exit_2_on_every_rank(pp2_checkpoint, tmp_path):
    """Each damage, loaded at 2 ranks through pretrain_gpt.py's entry point: one line for the job,
    both ranks exit 2 (rank 0 after its line, rank 1 when the launcher stops it), nothing changes."""
    for name in PP2_DAMAGE:
        copy, before, line = _damaged_pp2(pp2_checkpoint, tmp_path, name)
        proc, _ = launch(2, PP2 + ["--load", copy], str(tmp_path / f"{name}_out"), script="pretrain_gpt.py",
                         check=False)
        assert proc.rank_returncodes == [2, 2], (name, proc.rank_returncodes, proc.stdout[-3000:])
        lines = _error_lines(proc.stdout)
        assert len(lines) == 1 and lines[0].startswith(line), (name, lines)
        assert "Traceback" not in proc.stdout and digest(copy) == before, name


def test_a_damaged_file_under_the_deepspeed_command_exits_2_not_250(pp2_checkpoint, tmp_path):
    """The same refusal as users launch it, `deepspeed --num_gpus 2 pretrain_gpt.py` (fresh
    interpreters, output through a pipe as a terminal or a scheduler's log reads it): the command
    exits 2, without a C++ `terminate` line. Before pretrain_gpt.py's entry point left without
    interpreter teardown, about one such launch in five exited 250 (gloo's threads aborting rank 0
    after its line); test_clean_exit.py checks the skipped teardown itself."""
    copy, before, line = _damaged_pp2(pp2_checkpoint, tmp_path, "foreign")
    proc = subprocess.run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "pretrain_gpt.py",
                           *map(str, PP2 + ["--load", copy])], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=ROOT))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, (proc.returncode, output[-3000:])
    lines = _error_lines(output)
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert "terminate called" not in output and "Traceback" not in output, output[-3000:]
    assert digest(copy) == before


def _mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"a small filesystem cannot be mounted here (mount -t tmpfs: {proc.stderr.strip()})")
    return path


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    fp32 = TINY + ["--save-interval", 2]
    small, larger = str(tmp_path / "small"), str(tmp_path / "larger")
    try:
        # 3 MiB: room for a checkpoint (~1.8 MB) at startup (test_save_dir_startup: a disk without
        # it is refused then); while the run holds after its build, a file fills the disk to 1 MiB
        # free, and the first checkpoint fills it while it is written
        _mount_tmpfs(small, "3m")
        save, out, release = os.path.join(small, "ckpt"), tmp_path / "out1", tmp_path / "release"
        result = {}
        os.environ["DRIVER_HOLD_UNTIL"] = str(release)
        run = threading.Thread(target=lambda: result.update(
            proc=launch(1, fp32 + ["--train-iters", 2, "--save", save], str(out), check=False)[0]))
        try:
            run.start()
            while not (out / "rank0.held").exists() and run.is_alive():
                time.sleep(0.1)
            with open(os.path.join(small, "filler"), "wb") as f:
                f.write(bytes(shutil.disk_usage(small).free - (1 << 20)))
        finally:
            release.touch()
            run.join()
            del os.environ["DRIVER_HOLD_UNTIL"]
        proc = result["proc"]
        assert proc.returncode == 2, proc.stdout[-3000:]
        [line] = [line for line in proc.stdout.splitlines() if line.startswith("pretrain_gpt.py: error: ")]
        assert line.startswith(f"pretrain_gpt.py: error: --save {save}: no room for global_step2 (the disk filled "
                               f"while writing it): it needs more than ")
        assert line.endswith("bytes are free; nothing was saved; free some space or point --save at a larger disk")
        assert "Traceback" not in proc.stdout and os.listdir(save) == []  # the partial save is gone, no lock left
        # 3 MiB: iteration 2's checkpoint fits, iteration 4's does not (refused before writing anything)
        _mount_tmpfs(larger, "3m")
        proc, _ = launch(1, fp32 + ["--train-iters", 4, "--save", larger], str(tmp_path / "out2"), check=False)
        assert proc.returncode == 2 and "saved checkpoint at iteration 2" in proc.stdout
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(larger, "global_step2", "*"))
                   if not p.endswith(MANIFEST))
        [line] = [line for line in proc.stdout.splitlines() if line.startswith("pretrain_gpt.py: error: ")]
        expected = (f"pretrain_gpt.py: error: --save {larger}: no room for global_step4 (nothing written): it needs "
                    f"about {size} bytes (the size of the last checkpoint), FREE bytes are free; global_step2 stays "
                    f"the tracked checkpoint; free some space or point --save at a larger disk")
        match = re.fullmatch(re.escape(expected).replace("FREE", r"(\d+)"), line)
        assert match, line
        # what was free then: now, less the run's lock file (one page) it held then
        assert 0 <= shutil.disk_usage(larger).free - int(match.group(1)) <= 8192
        assert sorted(os.listdir(larger)) == ["global_step2", "latest", "latest_checkpointed_iteration.txt"]
        assert tracker(larger) == "2" and verify_tool(larger).returncode == 0
    finally:
        for path in (small, larger):
            subprocess.run(["umount", path], capture_output=True)
