"""One run per --save directory: DIR/megatron_save.lock names the run writing there. A second run
(a resubmitted job while the first still runs) stops in one line naming the first instead of
overwriting its checkpoints or resuming from them mid-write.

Only global rank 0 takes the lock (it alone moves the trackers; with many nodes, the one process
that decides for the job), at startup, before anything heavy (megatron/checkpoint/save_dir.py).
A lock names its run, not just a PID, which the kernel reuses: host, PID, the process's start
(clock ticks since boot), the machine's boot id and the PID namespace. On the host that wrote it,
a lock is stale, and taken over with a note, when its PID is gone, belongs to another process now
(another start) or the machine has rebooted since (another boot id). What cannot be decided here
stops the run in one line saying what to check and which file to delete: another host's lock,
another PID namespace's (a container), a running PID in a lock without a start time (written by
an older version), an unreadable lock file. The lock is written whole (a complete file hard-linked
into place), so a run killed while taking it leaves no half-written lock. Torch-free.
"""
import atexit
import contextlib
import errno
import json
import os
import socket
import time

from megatron.runtime.process_identity import boot_id, pid_namespace, start_ticks
from megatron.runtime.refusal import ConfigError

LOCK_FILE = "megatron_save.lock"
_HELD: dict[str, "SaveDirLock"] = {}  # absolute --save path -> the lock this process holds there


def lock_save_dir(save_dir: str) -> str | None:
    """Takes DIR's lock for this process (once: later calls find it held) and releases it at exit;
    returns a line saying whose stale lock was taken over, or None. Any refusal is a ConfigError."""
    key = os.path.abspath(save_dir)
    if key in _HELD:
        return None
    lock = SaveDirLock(save_dir)
    note = lock.acquire()
    _HELD[key] = lock
    atexit.register(lock.release)
    return note


def release_save_dir(save_dir: str) -> None:
    lock = _HELD.pop(os.path.abspath(save_dir), None)
    if lock is not None:
        lock.release()


def release_all() -> None:
    """Every lock this process holds (a run that failed, its process going on: a test's)."""
    for save_dir in list(_HELD):
        release_save_dir(save_dir)


def cannot_create(save_dir: str, e: OSError) -> str:
    return (f"--save {save_dir}: cannot create it ({e.strerror}: {e.filename}); point --save at a directory this "
            f"run can create and write")


def cannot_write(save_dir: str, e: OSError) -> str:
    """A read-only mount, a directory of another user, a full disk."""
    return (f"--save {save_dir}: cannot write there ({e.strerror}); point --save at a directory this run can "
            f"write, with room for its checkpoints")


def identity() -> dict:
    """What the lock records of this process."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "start_ticks": start_ticks(os.getpid()), "boot_id": boot_id(), "pid_namespace": pid_namespace()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM  # exists, owned by someone else
    return True


def _holder(path: str) -> dict | str | None:
    """The lock's content; None when there is none; why it is unusable (a string) when garbled."""
    try:
        with open(path) as f:
            holder = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    if not isinstance(holder, dict) or not isinstance(holder.get("host"), str) or type(holder.get("pid")) is not int:
        return "it names no host and PID"
    return holder


def _describe(holder: dict) -> str:
    return f"host {holder['host']}, PID {holder['pid']}, started {holder.get('start', '?')}"


def judge(holder: dict, me: dict) -> tuple[str, str]:
    """Whose lock `holder` is, seen from process `me` (identity()): ("ended", why) a run that is
    gone; ("live", "") another running run; ("mine", "") this process's; ("unknown", what) not
    decidable here ("host", "namespace" or "no start")."""
    pid = holder["pid"]
    if holder["host"] != me["host"]:
        return "unknown", "host"
    if holder.get("boot_id") and me["boot_id"] and holder["boot_id"] != me["boot_id"]:
        return "ended", "; the machine has rebooted since (another boot id)"
    if holder.get("pid_namespace") and me["pid_namespace"] and holder["pid_namespace"] != me["pid_namespace"]:
        return "unknown", "namespace"
    ticks = start_ticks(pid) if _alive(pid) else None
    if ticks is None and not _alive(pid):  # asked again: it may have ended since the first look
        return "ended", ""
    if holder.get("start_ticks") is None or ticks is None:  # an older version's lock; or no /proc
        return ("ended", f"; PID {pid} is this process now") if pid == me["pid"] else ("unknown", "no start")
    if ticks != holder["start_ticks"]:
        return "ended", f"; PID {pid} belongs to another process now"
    return ("mine", "") if pid == me["pid"] else ("live", "")


def _refusal(save_dir: str, path: str, holder: dict, what: str) -> str:
    """The one line of a lock this run may not take: what to check, which file to delete."""
    d, host, pid = save_dir, holder["host"], holder["pid"]
    if what == "live":
        return (f"--save {d} is in use by another run ({_describe(holder)}; lock file {path}); give this run another "
                f"--save directory, or wait for that run to end")
    if what == "host":
        return (f"--save {d} is locked by a run on another host ({_describe(holder)}; lock file {path}), which "
                f"cannot be checked from {socket.gethostname()}: once PID {pid} on {host} is no longer that run "
                f"(ps -p {pid} -o lstart,args there), delete {path}; or give this run another --save directory")
    if what == "namespace":
        return (f"--save {d} is locked by a process of another PID namespace on this host, a container "
                f"({_describe(holder)}; lock file {path}), which cannot be checked from here: once that run has "
                f"ended, delete {path}; or give this run another --save directory")
    return (f"--save {d} is locked by PID {pid}, which is running, but the lock ({_describe(holder)}; lock file "
            f"{path}) does not say when its process started (written by an older version): if PID {pid} is not "
            f"that run (ps -p {pid} -o lstart,args), delete {path}; else wait for it to end")


class SaveDirLock:
    """The lock of one --save directory, held by this process from acquire() to release()."""

    def __init__(self, save_dir: str) -> None:
        self.save_dir = save_dir
        self.path = os.path.join(save_dir, LOCK_FILE)
        self.held = False
        self.mine = identity()

    def acquire(self) -> str | None:
        """Takes the lock; returns a line saying whose stale lock was taken over, or None. A
        directory that cannot be created or written, another live run's lock and a lock that
        cannot be judged are each a ConfigError of one line."""
        d = self.save_dir
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise ConfigError(cannot_create(d, e)) from None
        note = None
        for _ in range(2):  # a second try after removing a stale lock
            try:
                created = self._create()
            except OSError as e:
                raise ConfigError(cannot_write(d, e)) from None
            if created:
                self.held = True
                return note
            holder = _holder(self.path)
            if holder is None:
                continue  # released in between
            if isinstance(holder, str):
                raise ConfigError(f"--save {d}: the lock file {self.path} is unreadable ({holder}), so it cannot "
                                  f"say which run holds it: if no run is writing to {d}, delete it")
            verdict, why = judge(holder, self.mine)
            if verdict in ("live", "unknown"):
                raise ConfigError(_refusal(d, self.path, holder, why if verdict == "unknown" else "live"))
            os.remove(self.path)
            if verdict == "ended":
                note = f"--save {d}: took over the lock of a run that has ended ({_describe(holder)}){why}"
        raise ConfigError(f"--save {d}: could not take the lock {self.path} (another run keeps creating it); "
                          f"give this run another --save directory")

    def _create(self) -> bool:
        """Writes the lock whole, then links it into place: False when a lock is there already."""
        tmp = f"{self.path}.{self.mine['host']}.{self.mine['pid']}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.mine, f)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                return self._create_exclusive()  # a filesystem without hard links
            return True
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def _create_exclusive(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.mine, f)
        return True

    def release(self) -> None:
        """Removes the lock if this process holds it (a run that ends, also by an error)."""
        if not self.held:
            return
        self.held = False
        holder = _holder(self.path)
        if isinstance(holder, dict) and all(holder.get(k) == self.mine[k] for k in ("host", "pid", "start_ticks")):
            os.remove(self.path)
