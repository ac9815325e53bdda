"""Every use of DeepSpeed's internals, in one place: its private attributes, the engine and
optimizer attributes it sets for itself, the modules it does not export (deepspeed.runtime.*,
deepspeed.moe.* besides the MoE layer, deepspeed.utils, deepspeed.checkpoint, deepspeed.ops) and
the functions this code base swaps for its own. The rest of the tree uses DeepSpeed's public API
only (deepspeed.initialize / init_distributed / add_config_arguments, deepspeed.pipe,
deepspeed.checkpointing, deepspeed.accelerator, deepspeed.moe.layer.MoE and the engine's public
methods); tests/unit/test_deepspeed_internals.py checks that.

Each function says why the public API does not suffice. Internals change between releases, so
`check_deepspeed_version` prints one line at startup when the installed DeepSpeed is outside the
releases this was tested with (setup.py's DEEPSPEED_TESTED).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from packaging.version import Version

# [lower, upper): the releases the suite ran on; kept equal to setup.py's DEEPSPEED_TESTED by hand
TESTED_DEEPSPEED = (Version("0.19"), Version("0.20"))


# --- the version check ------------------------------------------------------------------------------

def untested_deepspeed_line(version: str) -> str | None:
    """The warning line for a DeepSpeed release outside TESTED_DEEPSPEED; None inside it."""
    lower, upper = TESTED_DEEPSPEED
    if lower <= Version(version) < upper:
        return None
    return (f"WARNING: DeepSpeed {version} is outside the releases this code was tested with "
            f"(>={lower},<{upper}); megatron/runtime/deepspeed_internals.py reaches into DeepSpeed's internals, "
            f"which may differ in this release")


def check_deepspeed_version(version: str | None = None) -> str | None:
    """At startup (rank 0 prints): one line if the installed DeepSpeed is untested. A warning, not
    a stop: a later release usually still works, and the line names where to look if it does not."""
    if version is None:
        import deepspeed
        version = deepspeed.__version__
    line = untested_deepspeed_line(version)
    if line is not None and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        print(line, flush=True)
    return line


# --- modules DeepSpeed does not export ----------------------------------------------------------------

def disable_shm_comm_op() -> None:
    """On CPU DeepSpeed all-reduces through a JIT-built shared-memory op whose buffers outlive the
    run in /dev/shm. No config key or argument turns it off; its op registry does."""
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def pipe_model_data_parallel_topology(num_pp: int, num_mp: int, num_dp: int) -> Any:
    """DeepSpeed's rank grid (axes pipe, data, model). deepspeed.pipe exports PipelineModule and the
    layer specs but not the topology class its PipelineModule takes."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    return PipeModelDataParallelTopology(num_pp=num_pp, num_mp=num_mp, num_dp=num_dp)


def distributed_attention(core: Any, group: Any, scatter_idx: int, gather_idx: int) -> Any:
    """DeepSpeed-Ulysses' DistributedAttention (the all-to-alls around an attention core). DeepSpeed's
    tutorial imports it from deepspeed.sequence.layer; the package does not re-export it."""
    from deepspeed.sequence.layer import DistributedAttention
    return DistributedAttention(core, group, scatter_idx=scatter_idx, gather_idx=gather_idx)


def process_topology(axes: list[str], dims: list[int]) -> Any:
    """DeepSpeed's general rank grid (the last axis varies fastest), for layouts with a sequence axis."""
    from deepspeed.runtime.pipe.topology import ProcessTopology
    return ProcessTopology(axes=axes, dims=dims)


def parsed_config(config: dict) -> Any:
    """Parse a ds_config the way the engine will (raising DeepSpeed's own error for a bad key).
    Only deepspeed.initialize parses configs publicly, and that needs a model; validation runs
    before any model exists."""
    from deepspeed.runtime.config import DeepSpeedConfig
    return DeepSpeedConfig(config)


def grad_accum_dtype_name(parsed: Any) -> str | None:
    """The parsed config's data_types.grad_accum_dtype as the engine reads it
    (DeepSpeedEngine.get_data_types, DtypeEnum): fp32, bf16, fp16 or int8 whatever the spelling;
    None when absent (the model's dtype)."""
    from deepspeed.runtime.config import DtypeEnum
    value = parsed.grad_accum_dtype
    return None if value is None else DtypeEnum(value).name


def set_random_seed(seed: int) -> None:
    """Seed python, numpy and torch as PipelineModule's seed_layers does, so the plain GPTModel
    starts from the same weights as GPTModelPipe. The function lives in deepspeed.runtime.utils."""
    from deepspeed.runtime.utils import set_random_seed as deepspeed_set_random_seed
    deepspeed_set_random_seed(seed)


def deepspeed_logger() -> logging.Logger:
    """DeepSpeed's logger (for --log-level). DeepSpeed offers no setter; the object sits in
    deepspeed.utils."""
    from deepspeed.utils import logger
    return logger


def universal_checkpoint_constants() -> Any:
    """The key names of DeepSpeed's universal-checkpoint metadata (deepspeed.checkpoint.constants):
    its converter reads them from the module attribute; no public API writes that metadata."""
    from deepspeed.checkpoint import constants
    return constants


# --- the engine -----------------------------------------------------------------------------------

def skip_gradient_allreduce(engine: Any) -> None:
    """One DP replica: stop DeepSpeed from all-reducing the gradients over a single rank. The
    engine decides it from flags set in its constructor (DeepSpeedEngine.backward and the
    PipelineEngine's ReduceGrads); no config key turns them off."""
    engine.enable_backward_allreduce = False
    engine.pipeline_enable_backward_allreduce = False


def save_and_load_as_moe(engine: Any) -> None:
    """Every pipeline stage of an MoE model takes DeepSpeed's MoE checkpoint path, also a stage
    without an MoE layer (the engine sets has_moe_layers from the stage's own modules, and the two
    paths' collectives differ). No argument or config key sets it."""
    engine.has_moe_layers = True


def set_progress_counters(engine: Any, global_steps: int, global_samples: int, skipped_steps: int) -> None:
    """What engine.load_checkpoint restores, for a load that does not go through it (a resharded
    resume). The engine has no setter for its counters."""
    engine.global_steps = global_steps
    engine.global_samples = global_samples
    engine.skipped_steps = skipped_steps


@contextlib.contextmanager
def data_parallel_writer_also(engine: Any, also: Callable[[], bool]) -> Iterator[None]:
    """While the engine saves: a rank writes its files when DeepSpeed's rule says so or `also()`.
    DeepSpeed's rule (checkpoint_engine.is_data_parallel_writer) has no override; the instance
    attribute shadows the method until the save ends."""
    checkpoint_engine = engine.checkpoint_engine
    deepspeed_rule = checkpoint_engine.is_data_parallel_writer
    checkpoint_engine.is_data_parallel_writer = lambda rank: deepspeed_rule(rank) or also()
    try:
        yield
    finally:
        del checkpoint_engine.is_data_parallel_writer  # the class's method again


def basic_optimizer(engine: Any) -> Any:
    """The optimizer the model was given, before DeepSpeed wrapped it (fp16 / bf16 / ZeRO); the
    engine keeps it as an undocumented attribute."""
    return getattr(engine, "basic_optimizer", None) or engine.optimizer


def zero3_master_partitions(engine: Any) -> list[torch.Tensor]:
    """ZeRO 3's fp32 master partitions (empty for other optimizers). Its inner optimizer's param
    groups hold them only during step() (`_set_fp32_optimizer_param_groups`, cleared after), so
    after a step they are reachable only here."""
    return list(getattr(engine.optimizer, "fp32_partitioned_groups_flat", None) or [])


def current_loss_scale(engine: Any) -> float | None:
    """The dynamic (or static) loss scale of an fp16 run; None otherwise (bf16 and fp32 runs scale
    nothing, although DeepSpeed's ZeRO optimizer keeps a static 1.0). The engine does not report
    it; its fp16 optimizers keep it under names that changed in 0.18.6 (loss_scale_config)."""
    if not engine.fp16_enabled():
        return None
    optimizer = engine.optimizer
    if hasattr(optimizer, "loss_scale_config"):
        return optimizer.loss_scale_config.cur_scale
    return getattr(optimizer, "cur_scale", None)


# --- optimizers ---------------------------------------------------------------------------------------

def set_global_grad_norm(optimizer: Any, norm: torch.Tensor) -> None:
    """After our own clipping: the norm engine.get_global_grad_norm() then reports. The engine
    reads it from the optimizer's private `_global_grad_norm` and has no setter."""
    optimizer._global_grad_norm = norm


def torch_optimizer_of(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (its state is keyed by the fp32 tensors);
    the wrappers keep it in an undocumented `optimizer` attribute."""
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def state_partitioned_over_data_parallel(engine: Any) -> bool:
    """True when DeepSpeed splits the optimizer state over the DP ranks (ZeRO, or the bf16
    optimizer, which does so at stage 0 too). Only the class name tells the bf16 optimizer."""
    return engine.zero_optimization_stage() > 0 or type(engine.optimizer).__name__ == "BF16_Optimizer"


def gradient_holders(engine: Any, optimizer: Any) -> list[Any]:
    """The attributes of a DeepSpeed optimizer wrapper that hold gradient buffers (their names say
    `grad`), for the memory measurement; [] for the torch optimizer itself. The wrappers' buffers
    are not exposed."""
    if optimizer is getattr(engine, "basic_optimizer", optimizer):
        return []
    return [value for name, value in vars(optimizer).items() if "grad" in name]


def call_once_before_step(optimizer: Any, before: Callable[[Any], None]) -> None:
    """`before(optimizer)` when its step() is next entered, then step() is the original again.
    DeepSpeed's wrappers are not torch optimizers and have no step hooks, so step itself is
    shadowed on the instance."""
    original, shadowed = optimizer.step, "step" in vars(optimizer)

    def step(*a: Any, **kw: Any) -> Any:
        if shadowed:
            optimizer.step = original
        else:
            del optimizer.step  # the class's method again
        before(optimizer)
        return original(*a, **kw)
    optimizer.step = step


# --- the flat fp32 partitions of the mixed-precision / ZeRO optimizers ----------------------------------
# Putting full per-parameter fp32 masters and Adam state into a built engine's flat, DP-partitioned
# groups (ZeRO 1/2's DeepSpeedZeroOptimizer and BF16_Optimizer), the way DeepSpeed's own universal-
# checkpoint loader does (deepspeed/runtime/base_optimizer.py: load_hp_checkpoint_state_from_
# checkpoint_dir), but from tensors in memory: DeepSpeed only loads from a converted folder on disk.
# Each low-precision parameter `lp` carries `_hp_mapping`: where its fragment owned by this DP rank
# sits in the parameter (`lp_fragment_address`) and in the flat fp32 partition (`hp_fragment`).

def _lp_groups(optimizer: Any) -> list[list[torch.nn.Parameter]] | None:
    # BF16_Optimizer names its groups bf16_groups, DeepSpeedZeroOptimizer bit16_groups
    for name in ("bf16_groups", "bit16_groups"):
        if hasattr(optimizer, name):
            return getattr(optimizer, name)
    return None


def holds_flat_partitions(engine: Any) -> bool:
    """True for the optimizers whose parameters carry DeepSpeed's hp mapping."""
    groups = _lp_groups(engine.optimizer)
    return groups is not None and all(hasattr(p, "_hp_mapping") for group in groups for p in group)


MasterAndState = tuple[torch.Tensor, dict[str, torch.Tensor], Any]


def write_flat_state(engine: Any, value_of: Callable[[torch.nn.Parameter], MasterAndState],
                     with_optimizer: bool) -> None:
    """value_of(lp) -> (fp32 master of this TP rank, {moment: tensor}, step): written into this DP
    rank's partition; then the low-precision weights are refreshed from the masters (a DP
    all-gather, as after an optimizer step: every DP rank must call this)."""
    from deepspeed.utils.tensor_fragment import map_to_flat_opt_states
    optimizer = engine.optimizer
    base = optimizer.optimizer  # the torch optimizer over the flat fp32 partitions
    for lp_group, group in zip(_lp_groups(optimizer), base.param_groups, strict=True):
        keys, step = set(), None
        for lp in lp_group:
            mapping = lp._hp_mapping  # type: ignore[attr-defined]
            if mapping is None:  # this DP rank owns no element of lp
                continue
            master, moments, saved_step = value_of(lp)
            address = mapping.lp_fragment_address
            mapping.get_hp_fragment().data.copy_(master.reshape(-1).narrow(0, address.start, address.numel))
            if with_optimizer:
                mapping.optim_fragment = {k: v.reshape(-1).narrow(0, address.start, address.numel).clone()
                                          for k, v in moments.items()}
                keys |= set(moments)
                step = saved_step if step is None else step
        if keys:
            for lp in lp_group:  # a parameter without saved state (it never had a gradient) starts at zero
                hp_mapping = lp._hp_mapping  # type: ignore[attr-defined]
                if hp_mapping is not None:
                    fragment = hp_mapping.get_hp_fragment()
                    for key in keys - set(hp_mapping.optim_fragment):
                        hp_mapping.optim_fragment[key] = torch.zeros_like(fragment)
            flat = group["params"][0]
            map_to_flat_opt_states(flat, lp_group, base.state, keys)
            if step is not None:
                base.state[flat]["step"] = step.clone() if torch.is_tensor(step) else torch.tensor(float(step))
    optimizer.update_lp_params()


def set_loss_scaler(engine: Any, loss_scaler: Any) -> None:
    """fp16 with ZeRO: carry the saved dynamic loss scale over (DeepSpeed's universal loader does
    the same), instead of restarting from --initial-loss-scale. No public setter."""
    if loss_scaler is not None and hasattr(engine.optimizer, "loss_scaler"):
        engine.optimizer.loss_scaler = loss_scaler
        engine.optimizer.dynamic_loss_scale = loss_scaler.dynamic


# --- the pipeline module --------------------------------------------------------------------------------
# For megatron/model/gpt_model.py's GPTModelPipe (a PipelineModule subclass).

def set_stage_bounds(module: Any, parts: list[int]) -> None:
    """Our own layer split (PipelineModule._partition_layers overridden): DeepSpeed's `parts` and
    its private _set_bounds, which every partition method ends with. PipelineModule takes no
    precomputed split."""
    module.parts = list(parts)
    stage = module.stage_id
    module._set_bounds(start=module.parts[stage], stop=module.parts[stage + 1])


def stop_reseeding_layers(module: Any) -> None:
    """seed_layers is for building only: left on, DeepSpeed also reseeds every layer in every
    forward from a micro-batch counter checkpoints do not save. The constructor argument is the
    only switch, and it also seeds the build, so the attribute is turned off afterwards."""
    module.seed_layers = False


# --- mixture of experts ------------------------------------------------------------------------------
# DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) is public; its process groups are not: they live
# in deepspeed.utils.groups behind private functions, and the engine creates them only at
# initialize, after the experts are built (our experts' seeds and the parameter count need the
# EP position at build time).

def create_expert_groups(ep_size: int, expert_tensor_parallel: bool, mpu_module: Any) -> None:
    """DeepSpeed's expert-parallel and expert-data-parallel groups for `ep_size` (once; collective).
    The same two cases as MoE._create_process_groups."""
    from deepspeed.utils import groups
    groups.mpu = mpu_module
    if f"ep_size_{ep_size}" in groups._get_expert_parallel_group_dict():
        return
    if expert_tensor_parallel:
        groups._create_expert_data_and_model_parallel(ep_size, mpu=mpu_module)
    else:
        groups._create_expert_and_data_parallel(ep_size)


def expert_parallel_rank(group_name: str) -> int:
    """This rank's EP rank in DeepSpeed's group `group_name` (ep_size_<EP>)."""
    from deepspeed.utils import groups
    return groups._get_expert_parallel_rank(group_name)


def expert_data_parallel_rank(group_name: str) -> int:
    """This rank's rank in the expert-data-parallel group of `group_name`."""
    from deepspeed.utils import groups
    return groups._get_expert_data_parallel_rank(group_name)


def is_expert_parameter(param: torch.Tensor) -> bool:
    """DeepSpeed's mark on expert parameters (deepspeed.moe.utils, not exported)."""
    from deepspeed.moe.utils import is_moe_param
    return is_moe_param(param)


def split_moe_param_groups(param_groups: list[dict]) -> list[dict]:
    """The experts in optimizer groups of their own, marked `moe`, as DeepSpeed's ZeRO / bf16
    optimizers require; the helper sits in deepspeed.moe.utils, not exported."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    return split_params_into_different_moe_groups_for_optimizer(param_groups)


def replace_token_gather(gather: Callable[..., torch.Tensor]) -> None:
    """Swap DeepSpeed's MoE token gather over the TP group (the private mappings._gather_tokens,
    which gathers into a flat buffer gloo cannot fill) for `gather`; no option selects another."""
    from deepspeed.moe import mappings
    mappings._gather_tokens = gather
