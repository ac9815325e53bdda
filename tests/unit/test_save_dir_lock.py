"""The --save lock names its run, not just a PID (megatron/checkpoint/lock.py), each rule against
real processes: a `sleep` this test starts is a live process that is not a training run, whose
start the test reads through psutil (the lock reads /proc itself). What the lock may take over it
takes with a one-line note; what it may not is one line naming what to check and the file to
delete, with the lock file left as it was."""
import json
import os
import socket
import subprocess

import psutil
import pytest

from megatron.checkpoint.lock import LOCK_FILE, SaveDirLock
from megatron.runtime.refusal import ConfigError
from tests.support.launcher import TINY

STARTED = "2026-01-01 00:00:00 UTC"


def _ticks(pid):
    """Process `pid`'s start in clock ticks since the boot, through psutil."""
    return round((psutil.Process(pid).create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK"))


def _boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _lock(directory, pid, **fields):
    """Writes a lock as a run on this host would (fields override or, set to None, drop a key)."""
    holder = {"host": socket.gethostname(), "pid": pid, "start": STARTED, "boot_id": _boot_id(),
              "pid_namespace": os.readlink("/proc/self/ns/pid")}
    holder.update(fields)
    if "start_ticks" not in fields:
        holder["start_ticks"] = _ticks(pid)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_FILE)
    with open(path, "w") as f:
        json.dump({k: v for k, v in holder.items() if v is not None}, f)
    return path


def _refused(directory):
    """(the refusal's line, whether the lock file is byte for byte as before)."""
    path = os.path.join(directory, LOCK_FILE)
    with open(path, "rb") as f:
        before = f.read()
    with pytest.raises(ConfigError) as refusal:
        SaveDirLock(directory).acquire()
    with open(path, "rb") as f:
        return str(refusal.value), f.read() == before


def _taken_over(directory):
    """(the note, the new lock's content); the lock is released again."""
    lock = SaveDirLock(directory)
    note = lock.acquire()
    with open(os.path.join(directory, LOCK_FILE)) as f:
        holder = json.load(f)
    lock.release()
    assert not os.path.exists(os.path.join(directory, LOCK_FILE))
    return note, holder


def test_a_reused_pid_is_taken_over_with_a_note(sleeper, tmp_path):
    d, host, pid = str(tmp_path), socket.gethostname(), sleeper.pid
    # the run that had this PID started a tick before the process that has it now
    _lock(d, pid, start_ticks=_ticks(pid) - 1)
    note, holder = _taken_over(d)
    assert note == (f"--save {d}: took over the lock of a run that has ended (host {host}, PID {pid}, started "
                    f"{STARTED}); PID {pid} belongs to another process now")
    assert holder["pid"] == os.getpid() and holder["start_ticks"] == _ticks(os.getpid())
    assert sleeper.poll() is None  # the process that has the PID now is left alone


def test_a_live_runs_lock_is_refused(sleeper, tmp_path):
    d, path = str(tmp_path), os.path.join(tmp_path, LOCK_FILE)
    _lock(d, sleeper.pid)
    line, unchanged = _refused(d)
    assert line == (f"--save {d} is in use by another run (host {socket.gethostname()}, PID {sleeper.pid}, started "
                    f"{STARTED}; lock file {path}); give this run another --save directory, or wait for that run "
                    f"to end")
    assert unchanged


def test_a_lock_from_before_a_reboot_is_taken_over(sleeper, tmp_path):
    d = str(tmp_path)
    _lock(d, sleeper.pid, boot_id="00000000-0000-0000-0000-000000000000")  # its PID and start: a live process's
    note, holder = _taken_over(d)
    assert note.endswith(f"PID {sleeper.pid}, started {STARTED}); the machine has rebooted since (another boot id)")
    assert holder["boot_id"] == _boot_id()


def test_an_ended_runs_lock_is_taken_over(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    d = str(tmp_path)
    _lock(d, ended.pid, start_ticks=12345)
    note, _ = _taken_over(d)
    assert note == (f"--save {d}: took over the lock of a run that has ended (host {socket.gethostname()}, PID "
                    f"{ended.pid}, started {STARTED})")


def test_another_hosts_lock_says_what_to_check_and_which_file_to_delete(sleeper, tmp_path):
    d, path = str(tmp_path), os.path.join(tmp_path, LOCK_FILE)
    _lock(d, sleeper.pid, host="node-17")  # a PID that is alive here means nothing about node-17
    line, unchanged = _refused(d)
    assert line == (f"--save {d} is locked by a run on another host (host node-17, PID {sleeper.pid}, started "
                    f"{STARTED}; lock file {path}), which cannot be checked from {socket.gethostname()}: once PID "
                    f"{sleeper.pid} on node-17 is no longer that run (ps -p {sleeper.pid} -o lstart,args there), "
                    f"delete {path}; or give this run another --save directory")
    assert unchanged


def test_another_pid_namespaces_lock_is_refused(sleeper, tmp_path):
    d, path = str(tmp_path), os.path.join(tmp_path, LOCK_FILE)
    _lock(d, sleeper.pid, pid_namespace="pid:[1]")
    line, unchanged = _refused(d)
    assert line == (f"--save {d} is locked by a process of another PID namespace on this host, a container (host "
                    f"{socket.gethostname()}, PID {sleeper.pid}, started {STARTED}; lock file {path}), which cannot "
                    f"be checked from here: once that run has ended, delete {path}; or give this run another --save "
                    f"directory")
    assert unchanged


def test_an_older_lock_without_a_start_naming_a_running_pid_is_refused(sleeper, tmp_path):
    d, path = str(tmp_path), os.path.join(tmp_path, LOCK_FILE)
    _lock(d, sleeper.pid, start_ticks=None, boot_id=None, pid_namespace=None)  # as versions before this one wrote
    line, unchanged = _refused(d)
    assert line == (f"--save {d} is locked by PID {sleeper.pid}, which is running, but the lock (host "
                    f"{socket.gethostname()}, PID {sleeper.pid}, started {STARTED}; lock file {path}) does not say "
                    f"when its process started (written by an older version): if PID {sleeper.pid} is not that run "
                    f"(ps -p {sleeper.pid} -o lstart,args), delete {path}; else wait for it to end")
    assert unchanged


@pytest.mark.parametrize("content, why", [
    ("{not json", "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),  # an older version killed mid-write
    ('{"host": "node-17"}', "it names no host and PID"),
])
def test_a_garbled_lock_says_which_file_to_delete(tmp_path, content, why):
    d, path = str(tmp_path), os.path.join(tmp_path, LOCK_FILE)
    with open(path, "w") as f:
        f.write(content)
    line, unchanged = _refused(d)
    assert line == (f"--save {d}: the lock file {path} is unreadable ({why}), so it cannot say which run holds it: "
                    f"if no run is writing to {d}, delete it")
    assert unchanged


def test_the_refusals_are_one_line_and_exit_code_2_before_the_model(entry_point, sleeper, tmp_path):
    """Through pretrain_gpt.py: another host's lock, a garbled one, a live run's."""
    cases = {"host": lambda d: _lock(d, sleeper.pid, host="node-17"),
             "garbled": lambda d: open(os.path.join(d, LOCK_FILE), "w").close(),
             "live": lambda d: _lock(d, sleeper.pid)}
    for name, make in cases.items():
        d = str(tmp_path / name)
        os.makedirs(d)
        make(d)
        code, lines, builds = entry_point([str(f) for f in TINY + ["--train-iters", 1, "--save", d]])
        assert code == 2 and len(lines) == 1 and builds == [], (name, lines)
        assert lines[0].startswith(f"pretrain_gpt.py: error: --save {d}") and f"{d}/{LOCK_FILE}" in lines[0], lines
        assert os.listdir(d) == [LOCK_FILE]
