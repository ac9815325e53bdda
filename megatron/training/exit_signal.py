"""--exit-signal-handler: a rank that receives --exit-signal (SIGTERM by default, Megatron-LM's
flag), or whose launcher went away, asks for an exit; the Trainer agrees on it with the other ranks
after the current iteration (megatron/training/trainer.py, stop_flags) and every rank saves and exits 0.

The handler only sets a flag: a Python signal handler runs between two bytecodes of the main
thread, and anything heavier there (a save, a collective) could interleave with the collective the
iteration is in. The flag is read once per iteration, in the iteration's one small all-reduce.

The launcher watch covers what DeepSpeed's own launcher does not: `deepspeed` (the runner) passes
no signal on to the per-node launcher on a single node and dies at once on SIGTERM, and the
per-node launcher (`python -m deepspeed.launcher.launch`) is left running with its ranks; a
launcher killed with SIGKILL leaves its ranks training alone. A daemon thread checks once a second
that the rank's parent (and, under DeepSpeed's per-node launcher, the runner above it) is still
there, by parent PID: a process whose parent exits is re-parented at that moment, so a changed
parent PID is a dead parent, with no PID-reuse race. It runs off the training thread: the
iteration pays for none of it.
"""
import os
import signal
import threading
from types import FrameType
from typing import Any

# --exit-signal's choices (Megatron-LM's spelling: the signal's name)
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGUSR1": signal.SIGUSR1, "SIGUSR2": signal.SIGUSR2}
WATCH_INTERVAL_S = 1.0
DEEPSPEED_LAUNCHER = "deepspeed.launcher.launch"


def _parent_of(pid: int) -> int | None:
    """The parent PID of `pid` from /proc (None when it is gone or /proc cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def launcher_chain() -> list[tuple[int, int]]:
    """(process, its parent) pairs to watch: this rank and its parent, and, when the parent is
    DeepSpeed's per-node launcher, the launcher and the `deepspeed` runner that started it."""
    parent = os.getppid()
    chain = [(os.getpid(), parent)]
    if DEEPSPEED_LAUNCHER in _command_line(parent):
        runner = _parent_of(parent)
        if runner is not None and runner > 1:
            chain.append((parent, runner))
    return chain


class ExitSignalHandler:
    """Installed for the training loop (`install`), removed after it (`release`): `received` says
    why this rank wants to exit (a signal's name, or the launcher that went away), else None."""

    def __init__(self, signal_name: str = "SIGTERM", watch_launcher: bool = True) -> None:
        self.signal_name = signal_name
        self.signum = SIGNALS[signal_name]
        self.received: str | None = None
        self._previous: Any = None  # the handler install() replaced (signal.signal's result)
        self._chain = launcher_chain() if watch_launcher else []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def install(self) -> "ExitSignalHandler":
        self._previous = signal.signal(self.signum, self._handle)
        if self._chain:
            self._watcher = threading.Thread(target=self._watch, name="exit-signal-launcher-watch", daemon=True)
            self._watcher.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # later signals (the launcher's repeat, scancel's) change nothing: the exit is under way
        if self.received is None:
            self.received = self.signal_name

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            for pid, parent in self._chain:
                now = os.getppid() if pid == os.getpid() else _parent_of(pid)
                if now != parent and self.received is None:
                    self.received = f"its launcher (PID {parent}) exited"
            if self.received is not None:
                return

