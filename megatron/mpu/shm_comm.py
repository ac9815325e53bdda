"""Tensor-parallel all-reduces through shared memory, for CPU runs whose TP group sits on one host
(and sequence parallelism's all-gathers and reduce-scatters along dim 0, the same way).

On CPU every TP all-reduce through gloo crosses the loopback TCP stack (a few hundred microseconds
for the 256 KiB activations of a small model), which eats the compute TP saves. Here the ranks of a
TP group map one file of /dev/shm: each rank copies its tensor into its own slot, publishes a
sequence number, waits for its peers' numbers, and sums the slots itself.

- Same results as gloo: a group of 2 ranks only, where the sum a + b is exact whatever the order
  (IEEE addition commutes) and max is max; larger groups keep gloo, whose ring order a local sum
  would not reproduce bit for bit.
- Nothing left in /dev/shm: the file (and each rank's FIFO, which wakes a rank that sleeps while
  its peer is descheduled: with more ranks than cores, polling would take the peer's CPU) is
  unlinked as soon as every rank of the group has opened it (a barrier), so it outlives no process,
  whether the run ends normally, with an error or killed.
  Only a death during that set-up window could leave it; an atexit hook covers errors there.
- Two buffers used alternately: a rank may write call n + 1 into one while a slower peer still
  reads call n from the other; it cannot reach call n + 2 before that peer has published n + 1,
  i.e. finished reading n. So one wait per call is enough.

DeepSpeed's own shared-memory op (deepspeed/ops/csrc/cpu/comm) serves only the world group and
leaves its buffers in /dev/shm, so the trainer keeps it switched off (initialize.py).
"""
import atexit
import mmap
import os
import secrets
import select
import socket
import struct
import time

import torch
import torch.distributed as dist

PREFIX = "megatron-tp-"
SLOT_BYTES = 4 * 2 ** 20  # per rank and buffer; larger tensors go through in chunks
_FLAG_STRIDE = 64         # one cache line per rank's sequence number
_TIMEOUT_S = 1800.0       # a peer that never arrives (it died): fail instead of hanging forever
_SPIN_S = 1e-3            # how long a rank polls before it sleeps, when every local rank has a core
_FLAG = struct.Struct("q")
_SUPPORTED = (dist.ReduceOp.SUM, dist.ReduceOp.MAX)


class SharedMemoryGroup:
    def __init__(self, group: dist.ProcessGroup, slot_bytes: int = SLOT_BYTES) -> None:
        self.size = dist.get_world_size(group=group)
        self.rank = dist.get_rank(group=group)
        self.slot_bytes = slot_bytes
        self.seq = 0
        flags = self.size * _FLAG_STRIDE
        total = flags + 2 * self.size * slot_bytes
        # rank 0 names the data file and one FIFO per rank (its wake-up line); everyone opens all,
        # then rank 0 unlinks them: open descriptors and the mapping outlive the names
        names: list = [None]
        if self.rank == 0:
            base = os.path.join("/dev/shm", f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
            names = [[base] + [f"{base}.wake{r}" for r in range(self.size)]]
            for path in names[0]:
                atexit.register(_unlink, path)  # an error before the barrier below
            fd = os.open(base, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, total)
            os.close(fd)
            for path in names[0][1:]:
                os.mkfifo(path, 0o600)
        dist.broadcast_object_list(names, src=dist.get_global_rank(group, 0), group=group)
        self.path, *fifos = names[0]
        try:
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._mmap = mmap.mmap(fd, total)
            finally:
                os.close(fd)
            # O_RDWR: a FIFO opens without waiting for the other end; writes never block (a full
            # pipe already holds a wake-up for its reader)
            self._wake = [os.open(path, os.O_RDWR | os.O_NONBLOCK) for path in fifos]
            os.set_blocking(self._wake[self.rank], True)
        finally:
            dist.barrier(group=group)  # every rank has opened them (or failed): no name is needed any more
            if self.rank == 0:
                for path in names[0]:
                    _unlink(path)
        self._data = torch.frombuffer(self._mmap, dtype=torch.uint8)[flags:]
        self._peers = [r for r in range(self.size) if r != self.rank]
        self._slots: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
        # polling a peer's flag while the peer waits for a core would slow the peer down: with more
        # threads on this host than cores a rank sleeps at once (the launchers name the local ranks:
        # torchrun LOCAL_WORLD_SIZE, DeepSpeed LOCAL_SIZE; else the whole world counts as local)
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or dist.get_world_size())
        busy = local_ranks * torch.get_num_threads()
        self._spin_s = _SPIN_S if busy <= len(os.sched_getaffinity(0)) else 0.0

    def _slot(self, buffer: int, rank: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        key = (buffer, rank, dtype)
        if key not in self._slots:
            start = (buffer * self.size + rank) * self.slot_bytes
            self._slots[key] = self._data[start:start + self.slot_bytes].view(dtype)
        return self._slots[key][:numel]

    def _flag(self, rank: int) -> int:
        return _FLAG.unpack_from(self._mmap, rank * _FLAG_STRIDE)[0]

    def _wait(self, seq: int) -> None:
        """Until every rank has published `seq`: poll (TP peers run in lockstep) for up to the spin
        time, then sleep in a read of this rank's FIFO, which a peer writes after publishing. A
        ready flag may leave a wake-up unread; a later read returns at once and the loop checks
        the flags again."""
        spin_until = None
        while any(self._flag(r) < seq for r in self._peers):
            now = time.perf_counter()
            if spin_until is None:
                spin_until = now + self._spin_s
            if now < spin_until:
                continue
            ready, _, _ = select.select([self._wake[self.rank]], [], [], _TIMEOUT_S)
            if not ready:
                raise RuntimeError(
                    f"shared-memory TP all-reduce: a peer did not arrive within {_TIMEOUT_S:.0f} s"
                )
            os.read(self._wake[self.rank], 4096)

    def _publish(self, seq: int) -> None:
        _FLAG.pack_into(self._mmap, self.rank * _FLAG_STRIDE, seq)  # after the data (x86 keeps stores in order)
        for rank, fd in enumerate(self._wake):
            if rank != self.rank:
                try:
                    os.write(fd, b"1")
                except BlockingIOError:  # the pipe is full of unread wake-ups: the peer will look
                    pass

    def all_reduce(self, x: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """In place, like dist.all_reduce; x contiguous."""
        flat = x.view(-1)
        chunk = self.slot_bytes // x.element_size()
        for start in range(0, flat.numel(), chunk):
            part = flat[start:start + chunk]
            buffer = self._exchange(part)
            slots = [self._slot(buffer, r, x.dtype, part.numel()) for r in range(self.size)]
            if op == dist.ReduceOp.SUM:
                torch.add(slots[0], slots[1], out=part)
            else:
                torch.maximum(slots[0], slots[1], out=part)
        return x

    def all_gather_first_dim(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out = the ranks' x one after another, like dist.all_gather_single; x, out contiguous."""
        flat, dest, n = x.view(-1), out.view(-1), x.numel()
        chunk = self.slot_bytes // x.element_size()
        for start in range(0, n, chunk):
            part = flat[start:start + chunk]
            buffer = self._exchange(part)
            for r in range(self.size):
                dest[r * n + start:r * n + start + part.numel()].copy_(self._slot(buffer, r, x.dtype, part.numel()))
        return out

    def reduce_scatter_first_dim(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out = this rank's part (the rank-th of `size` equal parts) of the ranks' x summed, like
        dist.reduce_scatter_single; x, out contiguous. A chunk carries the same stretch of every
        part, so each rank sums only its own."""
        flat, dest, n = x.view(-1), out.view(-1), out.numel()
        chunk = self.slot_bytes // (self.size * x.element_size())
        for start in range(0, n, chunk):
            length = min(chunk, n - start)
            buffer = self._exchange(*(flat[r * n + start:r * n + start + length] for r in range(self.size)))
            mine = [self._slot(buffer, r, x.dtype, self.size * length)[self.rank * length:(self.rank + 1) * length]
                    for r in range(self.size)]
            torch.add(mine[0], mine[1], out=dest[start:start + length])
        return out

    def _exchange(self, *parts: torch.Tensor) -> int:
        """Copies `parts`, one after another, into this rank's slot of the next buffer and waits for
        every rank's; returns the buffer."""
        self.seq += 1
        buffer = self.seq % 2
        offset = 0
        slot = self._slot(buffer, self.rank, parts[0].dtype, sum(p.numel() for p in parts))
        for part in parts:
            slot[offset:offset + part.numel()].copy_(part)
            offset += part.numel()
        self._publish(self.seq)
        self._wait(self.seq)
        return buffer


_TP_GROUP: SharedMemoryGroup | None = None  # this rank's SharedMemoryGroup for its TP group, once enabled


def enable_for_tensor_model_parallel(group: dist.ProcessGroup) -> str:
    """Collective over the TP group. Returns a line saying which path the TP all-reduces take."""
    global _TP_GROUP
    if dist.get_world_size(group=group) == 1:
        return "TP all-reduce: none (TP=1)"
    if not applies(group):
        return "TP all-reduce: gloo (shared memory serves TP=2 on one host)"
    _TP_GROUP = SharedMemoryGroup(group)
    return f"TP all-reduce: shared memory ({PREFIX}* in /dev/shm, unlinked once mapped)"


def disable() -> None:
    global _TP_GROUP
    _TP_GROUP = None


@torch.compiler.disable  # --torch-compile: collectives stay eager (a graph break)
def tensor_model_parallel_all_reduce(x: torch.Tensor, op: dist.ReduceOp.RedOpType,
                                     group: dist.ProcessGroup | None) -> torch.Tensor:
    """x in place over the TP group: shared memory when enabled for this tensor, else torch.distributed."""
    if _TP_GROUP is not None and op in _SUPPORTED and x.device.type == "cpu":
        return _TP_GROUP.all_reduce(x, op)
    dist.all_reduce(x, op=op, group=group)
    return x


@torch.compiler.disable  # --torch-compile: collectives stay eager (a graph break)
def tensor_model_parallel_all_gather(x: torch.Tensor, out: torch.Tensor,
                                     group: dist.ProcessGroup | None) -> torch.Tensor:
    """out = the TP ranks' x along dim 0 (sequence parallelism): shared memory when enabled, else
    torch.distributed."""
    if _TP_GROUP is not None and x.device.type == "cpu":
        return _TP_GROUP.all_gather_first_dim(x, out)
    dist.all_gather_single(out, x, group=group)
    return out


@torch.compiler.disable  # --torch-compile: collectives stay eager (a graph break)
def tensor_model_parallel_reduce_scatter(x: torch.Tensor, out: torch.Tensor,
                                         group: dist.ProcessGroup | None) -> torch.Tensor:
    """out = this TP rank's dim-0 part of the ranks' x summed (sequence parallelism): shared memory
    when enabled, else torch.distributed."""
    if _TP_GROUP is not None and x.device.type == "cpu":
        return _TP_GROUP.reduce_scatter_first_dim(x, out)
    dist.reduce_scatter_single(out, x, group=group)
    return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def one_host(group: dist.ProcessGroup) -> bool:
    """Whether every rank of `group` runs on this host."""
    hosts = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    return len(set(hosts)) == 1


def applies(group: dist.ProcessGroup) -> bool:
    """The shared-memory path serves a TP group of 2 gloo ranks on one host (see the docstring)."""
    return (dist.get_world_size(group=group) == 2 and dist.get_backend(group) == "gloo"
            and os.path.isdir("/dev/shm") and one_host(group))

