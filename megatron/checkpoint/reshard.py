"""A saved checkpoint as full (TP=1) tensors, whatever its TP x PP layout, and the cut of full
tensors for one (TP rank, pipeline stage) of another layout. tools/convert_checkpoint_to_hf.py
and resuming at another layout (manager.py -> resume.py) both read checkpoints through this module.

Every tensor is keyed by the parameter table (megatron/model/analytic.py): (layer, key) = the
GPTModelPipe layer index and the name inside that layer, with the full shape and the TP split
dim. Nothing about the model's parameters is written here twice.

What DeepSpeed writes to DIR/global_stepN (only data-parallel rank 0 writes, except ZeRO's files):
  pipeline engine     layer_LL-model_TT-model_states.pt  layer LL's weights on TP rank TT (the
                                                          last stage's tied copy is not saved)
                      mp_rank_MM_model_states.pt          optimizer + our client state of model-
                                                          parallel rank MM = stage x TP + TP rank
  --no-pipeline-parallel  mp_rank_TT_model_states.pt      all of the above, the module under "module"
  fp16 / bf16 / ZeRO 1-2  [bf16_]zero_pp_rank_D_mp_rank_MM_optim_states.pt  the fp32 masters and Adam state
                          of DP rank D, flat (every DP rank writes its own; zero_state.py)
plus ours: megatron_layout.json (shape + layout) and megatron_model.json (numerics, tokenizer), see
layout.py.
Torch only: no DeepSpeed, no transformers. Reading never writes anything.
"""
import os
from collections.abc import Iterable
from typing import Any

import torch

from megatron.checkpoint.layout import (
    TRACKER,
    CheckpointLayout,
    read_layout,
    read_model_info,
    read_tracker,
    require_step_dir,
)
from megatron.checkpoint.shards import check_shard, load_shard
from megatron.checkpoint.zero_state import read_flat_state, zero_files
from megatron.model.analytic import ParamSpec, parameter_table, stage_of_layer, table_entry
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError


def optimizer_param_names(engine: Any) -> list[list[str]] | None:
    """The module name of every optimizer parameter, group by group: saved with the optimizer so
    that its state (indexed by position) can be put back at another layout. None when the
    optimizer holds copies instead of the module's parameters (fp16 / bf16 / ZeRO)."""
    names = {id(p): n for n, p in engine.module.named_parameters()}
    groups = [[names.get(id(p)) for p in group["params"]] for group in engine.optimizer.param_groups]
    return None if any(n is None for group in groups for n in group) else groups


def saved_precision(ds_config: dict) -> str:
    """fp32 / fp16 / bf16 from the ds_config DeepSpeed saves in every mp_rank file."""
    return next((p for p in ("bf16", "fp16") if (ds_config.get(p) or {}).get("enabled")), "fp32")


def table_key(name: str, shape: ModelShape, pipeline: bool) -> tuple[int, str]:
    """(layer, key) of the table entry a GPTModelPipe (pipeline=True) or GPTModel parameter name
    describes (the names are the table's own: analytic.module_name; the pipe's tied "embed"
    module is the embedding, layer 0, on every stage). A name without an entry is refused."""
    spec = table_entry(name, shape, pipeline)
    if spec is None:
        raise ConfigError(f"parameter {name} has no entry in the parameter table (megatron/model/analytic.py) of "
                          f"the model {shape.describe()}; it cannot be resharded or exported")
    return spec.layer, spec.key


def tp_cut(full: torch.Tensor, spec: ParamSpec, tp: int, tp_rank: int) -> torch.Tensor:
    """TP rank `tp_rank`'s slice of a full tensor by its entry's split rule: the rank's contiguous
    chunk of the split dim (whole kv groups of a fused QKV, whole gate / value pairs of a GLU, as
    ColumnParallelLinear holds them); the whole tensor when replicated."""
    dim = spec.partition_dim
    if dim is None:
        return full
    if full.shape[dim] % (tp * spec.block):  # the shape's validation refuses such a TP size first
        raise ConfigError(f"layer {spec.layer} {spec.key}: {full.shape[dim]} rows do not split into TP={tp} slices "
                          f"of whole {spec.fused or spec.split} blocks of {spec.block} rows")
    return full.chunk(tp, dim=dim)[tp_rank]


class Checkpoint:
    """One saved iteration of DIR (the tracker's, or `iteration`)."""

    def __init__(self, load_dir: str, iteration: int | None = None, flag: str = "--load") -> None:
        self.load_dir = load_dir
        where = f"{flag} {load_dir}"
        if not os.path.isdir(load_dir):
            raise ConfigError(f"{where}: no such directory")
        if iteration is None:
            iteration = read_tracker(load_dir, where)
            if iteration is None:
                raise ConfigError(f"{where}: not a checkpoint directory of this trainer "
                                  f"({os.path.join(load_dir, TRACKER)} is missing)")
        self.iteration = iteration
        self.step_dir = require_step_dir(load_dir, iteration, where)
        self.layout: CheckpointLayout = read_layout(self.step_dir, where)
        self.model_info: dict = read_model_info(self.step_dir)
        self.tp = self.layout.tensor_model_parallel_size
        self.pp = self.layout.pipeline_model_parallel_size
        self.pipeline = self.layout.ds_pipeline_enabled
        self.shape = self.layout.model_shape(self.model_info.get("seq_length"))
        self.specs = {(s.layer, s.key): s for s in parameter_table(self.shape)}

    def describe(self) -> str:
        return self.layout.describe()

    # --- file names ---------------------------------------------------------------------------
    def _layer_file(self, layer, tp_rank):
        return os.path.join(self.step_dir, f"layer_{layer:02d}-model_{tp_rank:02d}-model_states.pt")

    def _mp_file(self, stage, tp_rank):
        return os.path.join(self.step_dir, f"mp_rank_{stage * self.tp + tp_rank:02d}_model_states.pt")

    def shard_files(self, layers: Iterable[int] | None = None) -> list[str]:
        layers = self._layers(layers)
        files = [self._mp_file(s, t) for s in sorted({stage_of_layer(self.shape, l) for l in layers})
                 for t in range(self.tp)]
        if self.pipeline:
            files += [self._layer_file(l, t) for l in sorted(layers) for t in range(self.tp)]
        return files

    def check_readable(self, layers: Iterable[int] | None = None) -> None:
        """Every shard exists and its zip directory (at the end of the file) reads, ZeRO's DP-rank
        files too, and no other DP rank's file lies beside them: a missing or truncated shard fails
        here, before anything is built, naming the file (a dense model's files; an MoE model's are
        left to the manifest)."""
        for path in self.shard_files(layers):
            check_shard(path)
        setup = self.saved_setup()
        if setup["form"] != "flat":
            return
        stages = {stage_of_layer(self.shape, l) for l in self._layers(layers)}
        for mp_rank in sorted(stage * self.tp + t for stage in stages for t in range(self.tp)):
            saved = zero_files(self.step_dir, mp_rank, setup["dp"])
            for path in saved:
                check_shard(path)
            # DeepSpeed's own reader takes every DP rank's file it finds
            extra = [path for path in zero_files(self.step_dir, mp_rank) if path not in saved]
            if extra:
                raise ConfigError(f"{extra[0]}: not part of this checkpoint, which was saved at DP={setup['dp']} (a "
                                  f"leftover of a crashed save at another DP size); remove it")

    def _layers(self, layers: Iterable[int] | None) -> set[int]:
        return {s.layer for s in self.specs.values()} if layers is None else set(layers)

    # --- reading ------------------------------------------------------------------------------
    def client_state(self) -> dict:
        """mp_rank_00's client state (iteration, consumed samples, LR schedule, ...), without
        the optimizer and module."""
        state = load_shard(self._mp_file(0, 0))
        return {k: v for k, v in state.items() if k not in ("optimizer", "module")}

    def _local_weights(self, layer, tp_rank, mp_states):
        """{key: tensor} of one layer on one TP rank."""
        if self.pipeline:
            path = self._layer_file(layer, tp_rank)
            return path, load_shard(path)
        path = self._mp_file(0, tp_rank)
        if path not in mp_states:
            module = load_shard(path).get("module")
            if module is None:
                raise ConfigError(f"{path}: holds no module weights")
            mp_states[path] = {}
            for name, tensor in module.items():
                mp_states[path].setdefault(table_key(name, self.shape, False), tensor)
        weights = {key: t for (l, key), t in mp_states[path].items() if l == layer}
        return path, weights

    def read_weights(self, layers: Iterable[int] | None = None) -> dict[tuple[int, str], torch.Tensor]:
        """{(layer, key): full tensor} for every table parameter of `layers` (all by default)."""
        full, mp_states = {}, {}
        for layer in sorted(self._layers(layers)):
            specs = {key: spec for (l, key), spec in self.specs.items() if l == layer}
            parts = {}
            for tp_rank in range(self.tp):
                path, weights = self._local_weights(layer, tp_rank, mp_states)
                unknown = sorted(set(weights) - set(specs))
                if unknown:
                    raise ConfigError(f"{path}: parameters {', '.join(unknown)} of layer {layer} are not in the "
                                      f"parameter table of the saved shape")
                for key, _spec in specs.items():
                    if key not in weights:
                        raise ConfigError(f"{path}: parameter {key} of layer {layer} is missing")
                    parts.setdefault(key, []).append(weights[key])
            for key, spec in specs.items():
                full[(layer, key)] = self._merge(parts[key], spec, f"layer {layer} {key}")
        return full

    def _merge(self, parts: list[torch.Tensor], spec: ParamSpec, what: str) -> torch.Tensor:
        """The full tensor from the TP ranks' slices, by the entry's split rule (the inverse of
        tp_cut): replicated -> TP rank 0's copy, split -> the slices concatenated in rank order."""
        tensor = parts[0] if spec.partition_dim is None else torch.cat(parts, dim=spec.partition_dim)
        if tuple(tensor.shape) != tuple(spec.shape):
            raise ConfigError(f"{self.step_dir}: {what} merges to {tuple(tensor.shape)}, the saved shape says "
                              f"{tuple(spec.shape)}")
        return tensor

    def _plain_optimizer(self, path):
        """(optimizer state dict, parameter names) of one mp_rank file, or a one-line error."""
        state = load_shard(path)
        optimizer, names = state.get("optimizer"), state.get("optimizer_param_names")
        if not isinstance(optimizer, dict) or "state" not in optimizer:
            raise ConfigError(f"{path}: holds no optimizer state this code can reshard (DeepSpeed's FP16_Optimizer, "
                              f"fp16 or bf16 without ZeRO, keeps no parameter names); resume at the saved layout "
                              f"{self.describe()} or pass --no-load-optim")
        if names is None:
            raise ConfigError(f"{path}: the optimizer's parameter names were not saved (a checkpoint from before "
                              f"layout changes were supported); resume at the saved layout {self.describe()} or "
                              f"pass --no-load-optim")
        return optimizer, names

    def check_optimizer(self) -> None:
        """The optimizer state can be resharded (checked on one file, before anything is built)."""
        if self.saved_setup()["form"] != "flat":
            self._plain_optimizer(self._mp_file(0, 0))

    def saved_setup(self) -> dict:
        """What the checkpoint was saved with, from DeepSpeed's mp_rank_00 file: precision, ZeRO
        stage, DP size and the optimizer's form: "flat" (ZeRO 1/2 or BF16_Optimizer: fp32
        partitions with param_slice_mappings, see zero_state.py) or "torch" (the plain
        optimizer, fp32 without ZeRO)."""
        if getattr(self, "_setup", None) is None:
            state = load_shard(self._mp_file(0, 0))
            config = state.get("ds_config") or {}
            self._setup = {"precision": saved_precision(config), "dp": state.get("dp_world_size", 1),
                           "zero_stage": (config.get("zero_optimization") or {}).get("stage", 0),
                           "form": "flat" if zero_files(self.step_dir, 0) else "torch"}
        return self._setup

    def read_masters_and_optimizer(self, layers: Iterable[int] | None = None) -> tuple[dict, dict]:
        """({(layer, key): fp32 master or None}, {(layer, key): optimizer state}): the fp32 master
        weights (None where the weights are the masters: the plain fp32 optimizer) and Adam's
        full moments and step, whatever the saved precision, ZeRO stage and layout."""
        wanted = self._layers(layers)
        if self.saved_setup()["form"] == "flat":
            return read_flat_state(self, wanted, table_key)
        states, _ = self.read_optimizer(wanted)
        return {}, states

    def read_optimizer(self, layers: Iterable[int] | None = None
                       ) -> tuple[dict[tuple[int, str], dict[str, Any]], list[dict] | None]:
        """{(layer, key): {state name: full tensor, or the scalar step}} of the optimizer, from the
        stage that owns each parameter (TP rank 0 for TP-replicated ones, which every TP rank
        updates identically), and the saved param-group hyperparameters."""
        layers = self._layers(layers)
        stages = sorted({stage_of_layer(self.shape, l) for l in layers})
        parts, groups = {}, None
        for stage in stages:
            for tp_rank in range(self.tp):
                path = self._mp_file(stage, tp_rank)
                optimizer, names = self._plain_optimizer(path)
                groups = groups or [{k: v for k, v in g.items() if k != "params"} for g in optimizer["param_groups"]]
                flat = [n for group in names for n in group]
                for index, name in enumerate(flat):
                    layer, key = table_key(name, self.shape, self.pipeline)
                    spec = self.specs[(layer, key)]
                    if layer not in layers or stage != stage_of_layer(self.shape, layer):
                        continue  # another stage's copy (the tied embedding on the last stage)
                    if spec.partition_dim is None and tp_rank != 0:
                        continue
                    parts.setdefault((layer, key), []).append(optimizer["state"].get(index, {}))
        full = {}
        for (layer, key), states in parts.items():
            spec = self.specs[(layer, key)]
            merged = {}
            for name, value in states[0].items():
                if torch.is_tensor(value) and value.dim() > 0:
                    merged[name] = self._merge([s[name] for s in states], spec, f"optimizer {name} of {layer} {key}")
                else:
                    merged[name] = value
            full[(layer, key)] = merged
        return full, groups
