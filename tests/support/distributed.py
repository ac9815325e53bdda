"""Run a function on N real processes (gloo), each with torch.distributed, DeepSpeed's comm and
our model-parallel groups initialised, and collect what each rank returns."""
import io
import os
import traceback

import torch

from tests.support.launch import free_port, preloaded_context


def _worker(rank, world_size, port, tp, pp, sp, fn, args, queue, env):
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), DS_ACCELERATOR="cpu")
    try:
        import deepspeed
        import torch

        from megatron import mpu
        from megatron.training.initialize import disable_deepspeed_shm_comm
        torch.set_num_threads(1)
        disable_deepspeed_shm_comm()
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        mpu.initialize_model_parallel(tp, pp, sp)
        mpu.model_parallel_seed(1234)  # as initialize_megatron does
        buf = io.BytesIO()  # tensors as plain bytes: shared-memory handles die with the worker
        torch.save(fn(*args), buf)
        queue.put((rank, buf.getvalue(), None))
    except BaseException:  # report, don't hang the parent
        queue.put((rank, None, traceback.format_exc()))


def run_distributed(world_size, fn, *args, tp=1, pp=1, sp=1, timeout=300):
    """fn(*args) runs on every rank (sp: DeepSpeed-Ulysses' sequence-parallel size); returns
    [result of rank 0, rank 1, ...]. The workers are forked from a server that has imported torch,
    DeepSpeed and the trainer once (tests.support.launch.preloaded_context), not fresh interpreters that
    import them (~6 s of CPU each), and see this process's environment as it is now, as spawned ones would."""
    ctx = preloaded_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, tp, pp, sp, fn, args, queue, dict(os.environ)))
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
