"""--log-optimizer-states-to-tensorboard (Microsoft's Megatron-DeepSpeed): every log interval,
the L2 and L1 norms and the largest magnitude of Adam's second moment (exp_avg_sq), its square
root, the first moment (exp_avg) and the fp32 weights the optimizer updates, under the fork's
tags (`optimizer/variance_l2`, ... against iterations and `... vs tokens`).

As in the fork, the sums run over what the optimizers of the model-parallel ranks hold (a
parameter TP keeps whole, and the tied embedding's two pipeline copies, count on every rank that
holds one), plus the data-parallel ranks when DeepSpeed partitions the state over them (ZeRO, the
bf16 optimizer), so each partition counts once. SGD keeps no moments: nothing is written."""
from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from megatron.metrics.training_log import write_group
from megatron.runtime.deepspeed_internals import state_partitioned_over_data_parallel, torch_optimizer_of

if TYPE_CHECKING:  # annotations only
    from deepspeed import DeepSpeedEngine

    from megatron.schedules.progress import TrainingProgress

NAMES = ("variance", "variance_sqrt", "momentum", "weight")


def optimizer_state_norms(engine: DeepSpeedEngine, mpu: ModuleType) -> dict[str, float]:
    """{name: value} on every rank (collectives over TP, PP and, if partitioned, DP); {} for SGD."""
    inner = torch_optimizer_of(engine.optimizer)
    l2, l1, peak = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), torch.zeros(4)
    found = torch.zeros(1)
    for group in inner.param_groups:
        for p in group["params"]:
            state = inner.state.get(p, {})
            if "exp_avg_sq" not in state:
                continue
            found[0] = 1
            variance = state["exp_avg_sq"].detach().float()
            for i, t in enumerate((variance, variance.sqrt(), state["exp_avg"].detach().float(), p.detach().float())):
                l2[i] += float(t.norm()) ** 2
                l1[i] += float(t.norm(p=1))
                peak[i] = max(float(peak[i]), float(t.abs().max()) if t.numel() else 0.0)
    partitioned = state_partitioned_over_data_parallel(engine)
    groups = [mpu.get_model_parallel_group()] + ([mpu.get_data_parallel_group()] if partitioned else [])
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    sums, maxes = torch.cat([l2, l1]).to(device), torch.cat([peak, found]).to(device)
    for group in groups:
        dist.all_reduce(sums, group=group)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group)
    summed, maxed = sums.cpu().tolist(), maxes.cpu().tolist()
    if not maxed[4]:
        return {}
    out = {f"{name}_l2": math.sqrt(summed[i]) for i, name in enumerate(NAMES)}
    out.update({f"{name}_l1": summed[4 + i] for i, name in enumerate(NAMES)})
    out.update({f"{name}_abs_max": maxed[i] for i, name in enumerate(NAMES)})
    return out


def log_optimizer_states(writer: Any, values: dict[str, float], progress: TrainingProgress) -> None:
    for name, value in values.items():
        write_group(writer, f"optimizer/{name}", value, progress, axes=("iteration", "tokens"))
