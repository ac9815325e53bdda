"""Two TP ranks forked from one interpreter (torch and DeepSpeed imported once), for
tests/test_shm_tp_all_reduce.py. `python shm_tp_worker.py MODE`; MODE:
  compare  train a TP=2 GPT 3 steps through gloo, then the same from the same seed through the
           shared-memory path; print both ranks' losses and grad norms as JSON (exact floats)
  error    enable the shared-memory path, run an all-reduce, then raise
  kill     enable it, run an all-reduce, print READY and sleep until killed
Every mode prints the /dev/shm path the group used (PATH ...) as soon as it exists."""
import json
import os
import sys
import time

import deepspeed  # noqa: F401  (imported before the forks)
import torch

from megatron.launch import free_port


def _train(steps=3):
    from model_fixtures import tiny_batch, tiny_config

    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    from megatron.utils import is_owned_parameter
    config = tiny_config(num_layers=2, tensor_model_parallel_size=2, vocab_size=256)
    model = GPTModel(config, seed=1234)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(*tiny_batch(config, seed=step))
        loss.backward()
        squares = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()
                      if is_owned_parameter(p, mpu.get_tensor_model_parallel_rank()))
        total = torch.tensor([squares], dtype=torch.float64)
        torch.distributed.all_reduce(total)  # gloo, outside the path under test
        out.append((loss.item(), float(total.sqrt())))
        optimizer.step()
    return out


def _rank(rank, port, mode, write_fd):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", DS_ACCELERATOR="cpu")
    from megatron import mpu
    from megatron.initialize import disable_deepspeed_shm_comm
    from megatron.mpu import shm_comm
    torch.set_num_threads(1)
    disable_deepspeed_shm_comm()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    mpu.initialize_model_parallel(2, 1)
    mpu.model_parallel_seed(1234)
    report = {}
    if mode == "compare":
        report["gloo"] = _train()
    line = shm_comm.enable_for_tensor_model_parallel(mpu.get_tensor_model_parallel_group())
    if rank == 0:
        os.write(write_fd, f"PATH {shm_comm._TP_GROUP.path}\n{line}\n".encode())
    x = torch.full((1000,), float(rank + 1))
    shm_comm.tensor_model_parallel_all_reduce(x, torch.distributed.ReduceOp.SUM, mpu.get_tensor_model_parallel_group())
    assert bool((x == 3).all())
    if mode == "compare":
        mpu.model_parallel_seed(1234)
        report["shm"] = _train()
        os.write(write_fd, (json.dumps({"rank": rank, **report}) + "\n").encode())
    elif mode == "error":
        raise RuntimeError("failing on purpose after the shared-memory set-up")
    elif mode == "kill":
        if rank == 0:
            os.write(write_fd, b"READY\n")
        time.sleep(600)


def main(mode):
    read_fd, write_fd = os.pipe()
    port, children = free_port(), []
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _rank(rank, port, mode, write_fd)
            except BaseException as e:
                print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
                code = 1
            os._exit(code)
        children.append(pid)
    os.close(write_fd)
    print(f"PIDS {' '.join(map(str, children))}", flush=True)
    with os.fdopen(read_fd) as f:
        for line in f:
            print(line, end="", flush=True)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    print(f"EXIT {' '.join(map(str, codes))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
