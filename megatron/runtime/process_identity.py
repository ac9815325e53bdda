"""Who a process is beyond its PID, which the kernel reuses (after a reboot, or once enough
processes have come and gone): when it started and on which boot of which machine. The --save
lock records them (megatron/checkpoint/lock.py) and --exit-duration-in-mins counts from the
process's start (megatron/training/time_budget.py). Linux's /proc; torch-free."""
import os


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def boot_id() -> str | None:
    """A new random id at every boot of this machine (None without /proc)."""
    return _read("/proc/sys/kernel/random/boot_id")


def pid_namespace() -> str | None:
    """PIDs name processes only inside one PID namespace (a container may have its own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since the boot (field 22 of /proc/PID/stat),
    exact and never shared by two processes with the same PID; None when there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # field 2, the command name, is in parentheses and may itself hold spaces or ')'
    return int(text.rsplit(")", 1)[1].split()[19])


def process_start_time() -> float:
    """This process's start as time.time() counts (psutil's: the boot time plus the start ticks;
    psutil ships with DeepSpeed)."""
    import psutil
    return psutil.Process().create_time()
