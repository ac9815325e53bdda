"""Run a function on N real processes (gloo), each with torch.distributed, DeepSpeed's comm and
our model-parallel groups initialised, and collect what each rank returns."""
import gc
import io
import multiprocessing
import os
import traceback

import torch

from megatron.launch import free_port


def _worker(rank, world_size, port, tp, pp, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), DS_ACCELERATOR="cpu")
    try:
        import deepspeed
        import torch

        from megatron import mpu
        from megatron.initialize import disable_deepspeed_shm_comm
        torch.set_num_threads(1)
        disable_deepspeed_shm_comm()
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        mpu.initialize_model_parallel(tp, pp)
        mpu.model_parallel_seed(1234)  # as initialize_megatron does
        buf = io.BytesIO()  # tensors as plain bytes: shared-memory handles die with the worker
        torch.save(fn(*args), buf)
        queue.put((rank, buf.getvalue(), None))
    except BaseException:  # report, don't hang the parent
        queue.put((rank, None, traceback.format_exc()))
    # keep everything imported out of the interpreter's last garbage collection (about 1 s of CPU
    # per worker, for memory the OS takes back anyway); destructors still run at teardown
    gc.freeze()


# what every worker imports anyway: DeepSpeed (its CPU accelerator resolved at import, from the
# DS_ACCELERATOR conftest sets), torch._dynamo (the first torch.optim optimizer imports it: ~2.5 s)
# and the trainer
PRELOAD = ["deepspeed", "torch._dynamo", "megatron.training", "pretrain_gpt"]


def _context():
    """Workers are forked from a server that has imported PRELOAD once, not spawned as fresh
    interpreters that import it each time (~6 s of CPU per worker). The server runs no torch op,
    so there is no thread pool to fork."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_distributed(world_size, fn, *args, tp=1, pp=1, timeout=300):
    """fn(*args) runs on every rank; returns [result of rank 0, rank 1, ...]."""
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, tp, pp, fn, args, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, []
    try:
        for _ in range(world_size):
            rank, value, error = queue.get(timeout=timeout)
            if error:  # the other ranks may be stuck in a collective: stop them
                errors.append(f"rank {rank}:\n{error}")
                break
            results[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=0 if errors else 30)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
