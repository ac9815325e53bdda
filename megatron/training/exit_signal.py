"""The stop signals: a rank that receives SIGTERM (a scheduler, `scancel`), SIGINT (Ctrl-C), the
chosen --exit-signal (Megatron-LM's flag; SIGUSR1 / SIGUSR2 too), or whose launcher went away,
asks for an exit; the Trainer agrees on it with the other ranks after the current iteration
(megatron/training/trainer.py, stop_flags) and every rank saves and exits 0. The Trainer installs
it for every run with --save or --exit-signal-handler (docs/long-runs.md#stop-signals).

Why SIGINT and SIGTERM always, whatever --exit-signal is: Ctrl-C at a terminal sends SIGINT to the
whole process group, so each rank gets it directly, and DeepSpeed's per-node launcher, which gets it
too, sends SIGTERM to every rank at once. A rank that handled only one of the two was ended by the
other without a save.

The handler only records the first signal: a Python signal handler runs between two bytecodes of
the main thread, and anything heavier there (a save, a collective) could interleave with the
collective the iteration is in. The flag is read once per iteration, in the iteration's one small
all-reduce. Later signals (the launcher's SIGTERM after the SIGINT, a repeated `scancel`) change
nothing: the exit is under way, and the save is not cut short.

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
STOP_SIGNALS = ("SIGTERM", "SIGINT")  # handled whatever --exit-signal is (see above)
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
    why this rank wants to exit (the first stop signal's name, or the launcher that went away),
    else None. `exit_signal`: --exit-signal, handled besides SIGTERM and SIGINT."""

    def __init__(self, exit_signal: str = "SIGTERM", watch_launcher: bool = True) -> None:
        self.names = tuple(dict.fromkeys((*STOP_SIGNALS, exit_signal)))  # in order, once each
        self.received: str | None = None
        self._previous: dict[int, Any] = {}  # signal -> the handler install() replaced
        self._chain = launcher_chain() if watch_launcher else []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def install(self) -> "ExitSignalHandler":
        for name in self.names:
            self._previous[SIGNALS[name]] = signal.signal(SIGNALS[name], self._handle)
        if self._chain:
            self._watcher = threading.Thread(target=self._watch, name="exit-signal-launcher-watch", daemon=True)
            self._watcher.start()
        return self

    def release(self) -> None:
        self._stop.set()
        for signum, previous in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:  # the first one wins (see above)
            self.received = signal.Signals(signum).name

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            for pid, parent in self._chain:
                now = os.getppid() if pid == os.getpid() else _parent_of(pid)
                if now != parent and self.received is None:
                    self.received = f"its launcher (PID {parent}) exited"
            if self.received is not None:
                return
