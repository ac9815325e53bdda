"""The --save directory, checked at startup before anything heavy (the --load checkpoint's
verification, the model's build): rank 0 takes its lock (lock.py), which also proves that the
directory can be created and written; then every filesystem the ranks write checkpoint files to
must have room for one more checkpoint of the size this run writes, predicted from the memory
table (megatron/metrics/memory.py: the weights and optimizer state each rank saves). Otherwise one
line on every rank (a ConfigError: exit code 2), where a first save would have found it a save
interval later, or, with one rank failing alone, hung the others.

Which ranks write to one filesystem: those that see rank 0's lock file (a shared filesystem, the
usual case: every such rank's files count against its free space); the others, per host (a
node-local disk: the host's first rank creates the directory there, proves it can write, and
checks the room for that host's ranks)."""
import contextlib
import os
import shutil
import socket

from megatron import mpu
from megatron.checkpoint.agree import from_rank_0, gather, rank_and_world
from megatron.checkpoint.lock import LOCK_FILE, cannot_create, cannot_write, lock_save_dir, release_save_dir
from megatron.checkpoint.writer import remove_stale
from megatron.metrics.memory import RankMemory, TrainingSetup, predict_memory
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError


def rank_checkpoint_bytes(row: RankMemory, setup: TrainingSetup) -> int:
    """What one rank (its memory table row) writes into a checkpoint, as DeepSpeed saves: the
    weights from the first DP rank of each model-parallel rank (ZeRO 3 saves its partitioned
    weights only as the optimizer's fp32 copies); the optimizer state from every rank holding a
    partition of it (ZeRO, BF16_Optimizer), else from the first DP rank. Measured checkpoints are
    within a few percent of it (file headers, RNG and schedule state; the pipeline's tied embedding
    copy is counted but not saved)."""
    first = row.dp_rank == 0
    weights = row.weights if first and setup.zero_stage != 3 else 0
    optimizer = row.optimizer if first or setup.optimizer_wrapper() in ("zero", "zero3", "bf16") else 0
    return weights + optimizer


def checkpoint_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """One checkpoint of this run, all ranks together (every TP rank writes its slice)."""
    rows = predict_memory(shape, setup)
    return shape.tensor_model_parallel_size * sum(rank_checkpoint_bytes(row, setup) for row in rows)


def _my_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    rows = {(r.stage, r.dp_rank): r for r in predict_memory(shape, setup)}
    row = rows[(mpu.get_pipeline_model_parallel_rank(), mpu.get_sequence_data_parallel_rank())]
    return rank_checkpoint_bytes(row, setup)


def filesystem_groups(writers: list[tuple[str, bool, int]]) -> dict[int, int]:
    """{rank that checks a filesystem: bytes one checkpoint writes there}, from every rank's (host,
    whether it sees rank 0's lock, bytes it writes): rank 0 checks for the ranks that see its lock,
    the first rank of each other host for that host's ranks."""
    groups: dict[int, int] = {}
    first_of_host: dict[str, int] = {}
    for rank, (host, shared, size) in enumerate(writers):
        checker = 0 if shared else first_of_host.setdefault(host, rank)
        groups[checker] = groups.get(checker, 0) + size
    return groups


def _room(save_dir: str, needed: int) -> str | None:
    free = shutil.disk_usage(save_dir).free
    if free >= needed:
        return None
    return (f"--save {save_dir}: no room for this run's checkpoints: one needs about {needed} bytes (the weights and "
            f"optimizer state its ranks save there, predicted), {free} bytes are free; free some space or point "
            f"--save at a larger disk")


def _probe(save_dir: str) -> None:
    """Creates the directory and writes a file there (a node-local disk's check); ConfigError if not."""
    try:
        os.makedirs(save_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(cannot_create(save_dir, e)) from None
    probe = os.path.join(save_dir, f".megatron_probe.{socket.gethostname()}.{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("probe")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ConfigError(cannot_write(save_dir, e)) from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)


def _sees(save_dir: str, lock: str) -> bool:
    """Whether this rank reads rank 0's lock (its content `lock`) at the --save path."""
    with contextlib.suppress(OSError), open(os.path.join(save_dir, LOCK_FILE)) as f:
        return f.read() == lock
    return False


def _check(save_dir: str, checker_bytes: int | None, probe: bool) -> str | None:
    """This rank's share of the check: None, or the one line of what is wrong."""
    try:
        if probe:
            _probe(save_dir)
        return None if checker_bytes is None else _room(save_dir, checker_bytes)
    except ConfigError as e:
        return str(e)


def open_save_dir(save_dir: str, shape: ModelShape, setup: TrainingSetup) -> list[str]:
    """Every rank, at startup: the lock (rank 0), then the room (module docstring). Returns rank 0's
    notes (a stale lock taken over, a crashed save's leftovers removed); raises the ConfigError of
    the first problem on every rank."""
    rank, _ = rank_and_world()
    problem, lock, notes = None, None, []
    if rank == 0:
        try:
            note = lock_save_dir(save_dir)
            with open(os.path.join(save_dir, LOCK_FILE)) as f:
                lock = f.read()
        except (ConfigError, OSError) as e:
            problem = str(e)
        else:
            notes = [note] if note else []
            notes += [f"--save {save_dir}: {done}, left by a crashed save" for done in remove_stale(save_dir)]
    host = socket.gethostname()
    problem, lock, host_0 = from_rank_0((problem, lock, host))
    if problem:
        raise ConfigError(problem)
    shared = host == host_0 or _sees(save_dir, lock)
    groups = filesystem_groups(gather((host, shared, _my_bytes(shape, setup))))
    problems = [p for p in gather(_check(save_dir, groups.get(rank), not shared and rank in groups)) if p]
    if problems:
        if rank == 0:
            release_save_dir(save_dir)  # refused: this run writes nothing there
        raise ConfigError(problems[0])
    return notes
