"""One run per --save directory: DIR/megatron_save.lock names the run writing there (host, PID,
start time). A second run (a resubmitted job while the first still runs) stops in one line naming
the first instead of overwriting its checkpoints or resuming from them mid-write.

Only global rank 0 takes the lock (it alone moves the trackers; with many nodes, the one process
that decides for the job). A lock whose process is gone is stale and is taken over: a run killed
with SIGKILL, a node that rebooted. Staleness is known only on the host that wrote the lock (a PID
means nothing elsewhere): a lock of another host is reported with the file to delete once that
run is known to be gone. Torch-free.
"""
import errno
import json
import os
import socket
import time

from megatron.runtime.refusal import ConfigError

LOCK_FILE = "megatron_save.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # exists, owned by someone else
    return True


def _holder(path: str) -> dict | None:
    try:
        with open(path) as f:
            holder = json.load(f)
        return holder if isinstance(holder, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: written by a run killed mid-write (we write it whole, so: not ours)


def _describe(holder: dict) -> str:
    return (f"host {holder.get('host', '?')}, PID {holder.get('pid', '?')}, started "
            f"{holder.get('start', '?')}")


class SaveDirLock:
    """The lock of one --save directory, held by this process from acquire() to release()."""

    def __init__(self, save_dir: str) -> None:
        self.save_dir = save_dir
        self.path = os.path.join(save_dir, LOCK_FILE)
        self.held = False

    def acquire(self) -> str | None:
        """Takes the lock; returns a line saying whose stale lock was taken over, or None. Another
        live run's lock is a ConfigError naming it. A directory no lock can be written into is left
        unlocked: no run can save there, and the first save fails naming the error."""
        try:
            os.makedirs(self.save_dir, exist_ok=True)
        except OSError:  # nothing can be written there, by any run: the first save says why
            return None
        host, pid = socket.gethostname(), os.getpid()
        mine = {"host": host, "pid": pid, "start": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        note = None
        for _ in range(2):  # a second try after removing a stale lock
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                fd = None
            except OSError:  # a read-only or foreign directory: no run can save there, the save says why
                return None
            if fd is not None:
                with os.fdopen(fd, "w") as f:
                    json.dump(mine, f)
                    f.flush()
                    os.fsync(f.fileno())
                self.held = True
                return note
            holder = _holder(self.path)
            if holder is None:
                continue  # released in between
            stale = holder.get("host") == host and isinstance(holder.get("pid"), int) and (
                holder["pid"] == pid or not _alive(holder["pid"]))
            if not holder:  # empty or garbled: its writer died between creating and writing it
                stale = time.time() - os.path.getmtime(self.path) > 10
            if not stale:
                where = ("" if holder.get("host") == host else
                         "; a run on another host cannot be checked from here: if it has ended, delete the lock")
                raise ConfigError(f"--save {self.save_dir} is in use by another run ({_describe(holder)}; lock "
                                  f"file {self.path}){where}; give this run another --save directory, or wait "
                                  f"for that run to end")
            os.remove(self.path)
            if holder.get("pid") != pid:
                note = f"--save {self.save_dir}: took over the lock of a run that has ended ({_describe(holder)})"
        raise ConfigError(f"--save {self.save_dir}: could not take the lock {self.path} (another run keeps "
                          f"creating it); give this run another --save directory")

    def release(self) -> None:
        """Removes the lock if this process holds it (a run that ends, also by an error)."""
        if not self.held:
            return
        self.held = False
        holder = _holder(self.path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            os.remove(self.path)
