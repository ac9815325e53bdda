"""DeepSpeed's flat optimizer files of a saved checkpoint as full per-parameter tensors.

ZeRO 1/2 (DeepSpeedZeroOptimizer) and BF16_Optimizer keep the fp32 master weights and Adam's
moments as one flat tensor per parameter group, partitioned over the DP ranks; each DP rank
writes its partition to `[bf16_]zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt` with
`param_slice_mappings` (per group: parameter name -> fragment_address(numel, start) inside that
partition). A parameter's fragments, concatenated over the DP ranks in order, are its TP slice,
shaped as the `param_shapes` of the mp_rank file say; the parameter table then merges the TP
slices. Torch only; reading never writes anything.
"""
import glob
import os
import re
from collections.abc import Callable
from typing import Any

import torch

from megatron.checkpoint.shards import load_shard
from megatron.model.analytic import stage_of_layer
from megatron.runtime.refusal import ConfigError

MOMENTS = ("exp_avg", "exp_avg_sq")


def zero_files(step_dir: str, mp_rank: int, dp: int | None = None) -> list[str]:
    """The DP partitions' files of model-parallel rank `mp_rank`, in DP order: exactly DP ranks
    0 .. dp-1 when the saved DP size is given (a file of another DP rank beside them is not part
    of this checkpoint), else every one there is."""
    found = {}
    for path in glob.glob(os.path.join(step_dir, f"*zero_pp_rank_*_mp_rank_{mp_rank:02d}_optim_states.pt")):
        match = re.fullmatch(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt", os.path.basename(path))
        if match:
            found[int(match.group(1))] = path
    if dp is None:
        return [found[d] for d in sorted(found)]
    missing = [d for d in range(dp) if d not in found]
    if missing and found:
        raise ConfigError(f"{step_dir}: zero_pp_rank_{missing[0]}_mp_rank_{mp_rank:02d}_optim_states.pt is missing "
                          f"(saved at DP={dp}); the checkpoint is incomplete")
    return [found[d] for d in range(dp) if d in found]


def read_flat_state(checkpoint: Any, layers: set[int], table_key: Callable) -> tuple[dict, dict]:
    """({(layer, key): fp32 master}, {(layer, key): {"exp_avg", "exp_avg_sq", "step"}}) for every
    table parameter of `layers`, from the stage owning it and TP rank 0 for TP-replicated ones."""
    shape, tp = checkpoint.shape, checkpoint.tp
    stages = sorted({stage_of_layer(shape, layer) for layer in layers})
    parts = {}   # (layer, key) -> [TP slices of {"fp32", "exp_avg", "exp_avg_sq", "step"}]
    for stage in stages:
        for tp_rank in range(tp):
            mp_rank = stage * tp + tp_rank
            files = zero_files(checkpoint.step_dir, mp_rank, checkpoint.saved_setup()["dp"])
            if not files:
                raise ConfigError(f"{checkpoint.step_dir}: no zero_pp_rank_*_mp_rank_{mp_rank:02d}_optim_states.pt; "
                                  f"the checkpoint is incomplete")
            local_shapes = load_shard(checkpoint._mp_file(stage, tp_rank)).get("param_shapes")
            fragments = {}  # name -> {state: [fragment of each DP rank]}, steps
            for path in files:
                optim = load_shard(path)["optimizer_state_dict"]
                base = optim["base_optimizer_state"]["state"]
                for group, mapping in enumerate(optim["param_slice_mappings"]):
                    flat = {"fp32": optim["single_partition_of_fp32_groups"][group]}
                    flat.update({k: base[group][k] for k in MOMENTS if group in base})
                    for name, address in mapping.items():
                        entry = fragments.setdefault(name, {"group": group})
                        for state, tensor in flat.items():
                            entry.setdefault(state, []).append(tensor.narrow(0, address.start, address.numel))
                        if group in base and "step" in base[group]:
                            entry["step"] = base[group]["step"]
            shapes = {name: s for group in local_shapes for name, s in group.items()}
            for name, entry in fragments.items():
                layer, key = table_key(name, shape, checkpoint.pipeline)
                spec = checkpoint.specs[(layer, key)]
                if layer not in layers or stage != stage_of_layer(shape, layer):
                    continue  # the last stage's copy of the tied embedding
                if spec.partition_dim is None and tp_rank != 0:
                    continue  # TP-replicated: every TP rank holds and updates the same values
                local = {state: torch.cat(entry[state]).view(shapes[name]) for state in ("fp32",) + MOMENTS
                         if state in entry}
                if "step" in entry:
                    local["step"] = entry["step"]
                parts.setdefault((layer, key), []).append(local)
    masters, states = {}, {}
    for ident, slices in parts.items():
        spec = checkpoint.specs[ident]
        masters[ident] = checkpoint._merge([s["fp32"] for s in slices], spec, f"fp32 master of {ident}")
        merged = {k: checkpoint._merge([s[k] for s in slices], spec, f"optimizer {k} of {ident}")
                  for k in MOMENTS if k in slices[0]}
        if "step" in slices[0]:
            merged["step"] = slices[0]["step"]
        states[ident] = merged
    return masters, states


def read_loss_scaler(checkpoint: Any) -> Any:
    """fp16's dynamic loss scaler as saved (scale, iterations since the last overflow): the same on
    every rank, so DP rank 0 of the first model-parallel rank holds it. None when not saved."""
    files = zero_files(checkpoint.step_dir, 0)
    return load_shard(files[0])["optimizer_state_dict"].get("loss_scaler") if files else None
