"""Build GPTModelPipe for real with DeepSpeed's PipelineModule on PP gloo processes and print the
split it made (`parts`, as rank 0 holds it) for each configuration given as JSON on stdin.

One interpreter imports torch and DeepSpeed once; each configuration forks its PP ranks from it
(before any torch work, so no thread pool is forked), which makes 12 stages affordable."""
import json
import os
import sys

import deepspeed  # noqa: F401  (imported once, before the forks)
import torch  # noqa: F401

from tests.support.launch import free_port


def _rank(rank, world, port, fields, write_fd):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from megatron import mpu
    from megatron.training.initialize import disable_deepspeed_shm_comm
    from tests.support.model_fixtures import tiny_config
    torch.set_num_threads(1)
    disable_deepspeed_shm_comm()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    mpu.initialize_model_parallel(1, world)
    from megatron.model.gpt_model import GPTModelPipe
    config = tiny_config(pipeline_model_parallel_size=world, **fields)
    model = GPTModelPipe(config, PipeModelDataParallelTopology(num_pp=world, num_mp=1, num_dp=1))
    if rank == 0:
        os.write(write_fd, (json.dumps([int(p) for p in model.parts]) + "\n").encode())
    torch.distributed.barrier()


def build(fields, pp):
    read_fd, write_fd = os.pipe()
    port, children = free_port(), []
    for rank in range(pp):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _rank(rank, pp, port, fields, write_fd)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            os._exit(code)
        children.append(pid)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        line = f.readline()
    codes = [os.waitpid(pid, 0)[1] for pid in children]
    assert not any(codes), f"a rank failed building {fields} at PP={pp}"
    return json.loads(line)


if __name__ == "__main__":
    print(json.dumps([build(fields, pp) for fields, pp in json.load(sys.stdin)]))
