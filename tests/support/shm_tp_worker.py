"""Two TP ranks forked from one interpreter (torch and DeepSpeed imported once), for
tests/integration/test_shm_tp_all_reduce.py. `python shm_tp_worker.py MODE`; MODE:
  compare  train a TP=2 GPT 3 steps through gloo, then the same from the same seed through the
           shared-memory path; print both ranks' losses and grad norms as JSON (exact floats)
  error    enable the shared-memory path, run an all-reduce, then raise
  kill     enable it, run an all-reduce, print READY and sleep until killed
  chunks   all-reduce tensors of several chunks (odd sizes, fp32 / bf16 / fp16, SUM and MAX) through
           gloo and through the shared-memory path; print, per case, whether the two are bitwise equal;
           the same for sequence parallelism's dim-0 all-gather and reduce-scatter
Every mode prints the /dev/shm path the group used (PATH ...) as soon as it exists."""
import json
import os
import sys
import time

import deepspeed  # noqa: F401  (imported before the forks)
import torch

from tests.support.launch import free_port


def _train(steps=3):
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    from megatron.utils import is_owned_parameter
    from tests.support.model_fixtures import tiny_batch, tiny_config
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


def _chunk_cases(rank, group):
    """[(case, chunks, equal to gloo bit for bit, equal to the sum of both inputs)] on this rank.
    Each rank's input: normal values scaled by 10^-4 .. 10^4, so that the sum rounds in every way;
    the default slot size (the trainer's) and a tiny one (many chunks, both buffers reused often)."""
    from megatron.mpu import shm_comm
    tiny = shm_comm.SharedMemoryGroup(group, slot_bytes=1000)  # 250 fp32 / 500 half elements a chunk
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        per_chunk = shm_comm.SLOT_BYTES // torch.tensor([], dtype=dtype).element_size()
        for where, numel in (("default", 2 * per_chunk + 12345), ("default", 3 * per_chunk),
                             ("default", 4097), ("tiny", 10007), ("tiny", 500 * 7)):
            for op in (torch.distributed.ReduceOp.SUM, torch.distributed.ReduceOp.MAX):
                inputs = []
                for r in range(2):  # both ranks' inputs, on each rank: the sum is known here too
                    g = torch.Generator().manual_seed(1000 * r + numel)
                    values = torch.randn(numel, generator=g, dtype=torch.float64)
                    scale = 10.0 ** torch.randint(-4, 5, (numel,), generator=g)
                    inputs.append((values * scale).clamp(-6e4, 6e4).to(dtype))  # fp16's range
                x = inputs[rank]
                by_gloo = x.clone()
                torch.distributed.all_reduce(by_gloo, op=op, group=group)
                by_shm = x.clone()
                if where == "tiny":
                    tiny.all_reduce(by_shm, op)
                else:
                    shm_comm.tensor_model_parallel_all_reduce(by_shm, op, group)
                chunk = per_chunk if where == "default" else tiny.slot_bytes // x.element_size()
                expected = (inputs[0] + inputs[1] if op == torch.distributed.ReduceOp.SUM
                            else torch.maximum(inputs[0], inputs[1]))
                bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
                name = "sum" if op == torch.distributed.ReduceOp.SUM else "max"
                out.append((f"{str(dtype)[6:]} {numel} {where} {name}",
                            -(-numel // chunk), bool(torch.equal(by_shm.view(bits), by_gloo.view(bits))),
                            bool(torch.equal(by_shm.view(bits), expected.view(bits)))))
    return out


def _sequence_cases(rank, group):
    """[(case, chunks, equal to gloo bit for bit, equal to the expected)] of sequence parallelism's
    dim-0 all-gather (the ranks' inputs one after another) and reduce-scatter (this rank's half of
    the sum), in fp32 / bf16 / fp16 at the default slot size (several chunks) and a tiny one."""
    from megatron.mpu import shm_comm
    tiny = shm_comm.SharedMemoryGroup(group, slot_bytes=1000)
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        size = torch.tensor([], dtype=dtype).element_size()
        for where, numel in (("default", 2 * shm_comm.SLOT_BYTES // size + 12345), ("default", 4097),
                             ("tiny", 10007)):
            inputs = []
            for r in range(2):  # both ranks' inputs ([2 x numel] each), on each rank
                g = torch.Generator().manual_seed(1000 * r + numel)
                values = torch.randn(2 * numel, generator=g, dtype=torch.float64)
                scale = 10.0 ** torch.randint(-4, 5, (2 * numel,), generator=g)
                inputs.append((values * scale).clamp(-6e4, 6e4).to(dtype))
            bits = {2: torch.int16, 4: torch.int32}[size]
            slot = shm_comm.SLOT_BYTES if where == "default" else tiny.slot_bytes
            # all-gather of this rank's first half
            x = inputs[rank][:numel].clone()
            by_gloo, by_shm = torch.empty(2 * numel, dtype=dtype), torch.empty(2 * numel, dtype=dtype)
            torch.distributed.all_gather_single(by_gloo, x, group=group)
            if where == "tiny":
                tiny.all_gather_first_dim(x, by_shm)
            else:
                shm_comm.tensor_model_parallel_all_gather(x, by_shm, group)
            expected = torch.cat([inputs[0][:numel], inputs[1][:numel]])
            out.append((f"{str(dtype)[6:]} {numel} {where} all-gather", -(-numel // (slot // size)),
                        bool(torch.equal(by_shm.view(bits), by_gloo.view(bits))),
                        bool(torch.equal(by_shm.view(bits), expected.view(bits)))))
            # reduce-scatter of this rank's whole input
            x = inputs[rank]
            by_gloo, by_shm = torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype)
            torch.distributed.reduce_scatter_single(by_gloo, x.clone(), group=group)
            if where == "tiny":
                tiny.reduce_scatter_first_dim(x, by_shm)
            else:
                shm_comm.tensor_model_parallel_reduce_scatter(x, by_shm, group)
            expected = (inputs[0] + inputs[1])[rank * numel:(rank + 1) * numel]
            out.append((f"{str(dtype)[6:]} {numel} {where} reduce-scatter", -(-numel // (slot // (2 * size))),
                        bool(torch.equal(by_shm.view(bits), by_gloo.view(bits))),
                        bool(torch.equal(by_shm.view(bits), expected.view(bits)))))
    return out


def _rank(rank, port, mode, write_fd):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", DS_ACCELERATOR="cpu")
    from megatron import mpu
    from megatron.mpu import shm_comm
    from megatron.training.initialize import disable_deepspeed_shm_comm
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
    elif mode == "chunks":
        cases = _chunk_cases(rank, mpu.get_tensor_model_parallel_group())
        sequence = _sequence_cases(rank, mpu.get_tensor_model_parallel_group())
        os.write(write_fd, (json.dumps({"rank": rank, "cases": cases, "sequence": sequence}) + "\n").encode())
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
