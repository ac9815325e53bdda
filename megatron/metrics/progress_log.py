"""--log-progress (Megatron-LM): `progress.txt` in the --save directory, one line when a job starts
and one at each checkpoint saved, with the job's and the cumulative throughput, the floating-point
operations and the tokens trained so far: the compute C of every checkpoint.

The lines are Megatron-LM's (tab-separated; its get_start_time_from_progress_log parses them):

    2026-12-06 03:30:00\tJob ID: 123\t# GPUs: 2\tStarting job
    2026-12-06 03:31:00\tJob ID: 123\t# GPUs: 2\tSaved checkpoint\tIteration: 8\t
        Job throughput: 0.01 TFLOP/s/GPU\tCumulative throughput: 0.01 TFLOP/s/GPU\t
        Floating-point operations: 226492416\tTokens (in billions): 1.024e-06\tTokens: 1024

Differences, for exact counts: the operations are the exact integer (Megatron-LM: 2 digits), the
tokens in billions are not rounded, and a last field gives the exact tokens. The operations are the
model's (no recomputation; Megatron-LM's num_floating_point_operations), summed per iteration from
the FLOPs per sample cached once at model build (args.model_flops_per_sample_at), carried in the
checkpoint's progress. Cumulative throughput: since the first job of an unbroken series at this
number of ranks (a change of layout starts a new series), as Megatron-LM counts it."""
import os
import time
from datetime import datetime

FILE = "progress.txt"
_STAMP = "%Y-%m-%d %H:%M:%S"


def append(save_dir: str, world_size: int, message: str) -> None:
    """One line (rank 0 calls it): the time, the job id (SLURM_JOB_ID), the ranks, `message`."""
    os.makedirs(save_dir, exist_ok=True)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    with open(os.path.join(save_dir, FILE), "a") as f:
        f.write(f"{datetime.now().strftime(_STAMP)}\tJob ID: {job_id}\t# GPUs: {world_size}\t{message}\n")


def _field(token: str) -> str:
    return token.split(": ", 1)[1]


def series_start(save_dir: str, world_size: int) -> tuple[float, int | None] | None:
    """(time, operations at that time) of the first 'Starting job' of the last unbroken series of
    jobs at `world_size` ranks; the operations are those of the last checkpoint saved before it
    (None: none was saved in this directory before, e.g. a run loaded from another --load)."""
    start: tuple[float, int | None] | None = None
    last_saved: int | None = None
    with open(os.path.join(save_dir, FILE)) as f:
        for line in f:
            tokens = line.rstrip("\n").split("\t")
            if len(tokens) < 4:
                continue
            if tokens[3] == "Saved checkpoint":
                last_saved = int(float(_field(tokens[7])))
            if int(_field(tokens[2])) != world_size:
                start = None
            elif tokens[3] == "Starting job" and start is None:
                start = (datetime.strptime(tokens[0], _STAMP).timestamp(), last_saved)
    return start


def checkpoint_line(save_dir: str, world_size: int, iteration: int, operations: int, tokens: int,
                    job_start: float, job_start_operations: int) -> str:
    """The 'Saved checkpoint' line: the job's throughput since it started (`job_start`, with
    `job_start_operations` done), the series' since its first job (its time is whole seconds:
    never less than the job's own time)."""
    now = time.time()
    job_seconds = max(now - job_start, 1e-9)
    job = (operations - job_start_operations) / (job_seconds * 1e12 * world_size)
    started = series_start(save_dir, world_size)
    since, since_operations = started if started is not None else (job_start, None)
    if since_operations is None:
        since_operations = job_start_operations
    cumulative = (operations - since_operations) / (max(now - since, job_seconds) * 1e12 * world_size)
    return (f"Saved checkpoint\tIteration: {iteration}\tJob throughput: {job:.4g} TFLOP/s/GPU\t"
            f"Cumulative throughput: {cumulative:.4g} TFLOP/s/GPU\tFloating-point operations: {operations}\t"
            f"Tokens (in billions): {tokens / 1e9!r}\tTokens: {tokens}")
