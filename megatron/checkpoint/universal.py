"""Interoperability with DeepSpeed's universal checkpoint (deepspeed/checkpoint/ds_to_universal.py).

Saving: every checkpoint carries `universal_checkpoint_info` (set on the module, where DeepSpeed's
save reads it for dense and MoE models alike): regular expressions naming, by their module
names, the parameters that TP replicates, the row-parallel ones (TP split on dim 1) and the
pipeline-replicated ones (the last stage's copy of the tied embedding). They come from the
parameter table (megatron/model/analytic.py), for the whole model, whatever stage writes them.
Nothing else needs declaring:
  - a column-parallel weight (QKV with any number of kv heads, a GLU's dense_h_to_4h) is one
    contiguous row block per TP rank: the fused QKV holds whole kv groups per rank and a GLU's
    rows alternate gate / value, so DeepSpeed's default (concatenate on dim 0) merges them;
  - no vocabulary patterns: DeepSpeed would cut the padded rows (they are real logits here) and
    re-pad them with zeros; the padded vocab stays as saved, as our own --load keeps it.

Loading (--universal-checkpoint, the forks' flag): the ds_config gets
`"checkpoint": {"load_universal": true}` and DeepSpeed reads `DIR/<tag>/zero/<param>/*.pt`
(tag from DIR/latest_universal), cutting TP slices and DP partitions itself.
"""
import json
import os
import re
from typing import Any

from megatron.checkpoint.layout import LATEST_UNIVERSAL, CheckpointLayout, read_pointer
from megatron.checkpoint.shards import load_shard
from megatron.model.analytic import module_name, parameter_table
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError


def _pattern(spec, shape, pipeline):
    # one pattern per kind of transformer-layer parameter (layer and expert indices as \d+), so
    # the list does not grow with depth; the embedding, final norm and output layer by exact name
    escaped = re.escape(module_name(spec, shape, pipeline))
    if 1 <= spec.layer <= shape.num_layers:
        escaped = re.sub(r"\d+", r"\\d+", escaped)
    return f"^{escaped}$"


def universal_checkpoint_info(shape: ModelShape, pipeline: bool) -> dict:
    from megatron.runtime.deepspeed_internals import universal_checkpoint_constants
    c = universal_checkpoint_constants()
    specs = parameter_table(shape)
    replicated = sorted({_pattern(s, shape, pipeline) for s in specs if s.partition_dim is None})
    row_parallel = sorted({_pattern(s, shape, pipeline) for s in specs if s.partition_dim == 1})
    info = {c.UNIVERSAL_CHECKPOINT_VERSION_KEY: c.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            c.TP_REPLICATED_PARAMETER_PATTERNS: replicated,
            c.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: row_parallel,
            c.PIPELINE_REPLICATED_PARAMETER_PATTERNS: [r"^tied_modules\.embed\."] if pipeline and shape.tied else [],
            c.VOCABULARY_PARAMETER_PATTERNS: [], c.PARAMETER_TO_AVERAGE_PATTERNS: [],
            c.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0: [],
            # informational (no vocabulary pattern uses them): the vocab stays padded as saved
            c.ORIGINAL_VOCAB_SIZE: shape.padded_vocab_size, c.PADDED_VOCAB_SIZE: shape.padded_vocab_size}
    return info


def attach_universal_checkpoint_info(engine: Any, shape: ModelShape, pipeline: bool) -> None:
    """Before engine.save_checkpoint: DeepSpeed writes the module attribute into every
    mp_rank_*_model_states.pt (client_state cannot carry it for MoE models)."""
    from megatron.runtime.deepspeed_internals import universal_checkpoint_constants
    UNIVERSAL_CHECKPOINT_INFO = universal_checkpoint_constants().UNIVERSAL_CHECKPOINT_INFO
    if getattr(engine.module, UNIVERSAL_CHECKPOINT_INFO, None) is None:
        setattr(engine.module, UNIVERSAL_CHECKPOINT_INFO,
                universal_checkpoint_info(shape, pipeline))


def read_universal_tag(load_dir: str) -> str:
    path = os.path.join(load_dir, LATEST_UNIVERSAL)
    where = f"--universal-checkpoint --load {load_dir}"
    tag = read_pointer(path)  # the tracker DeepSpeed reads with load_universal
    if tag is None:
        raise ConfigError(f"{where}: {path} is missing; convert with DeepSpeed's ds_to_universal.py "
                          f"--input_folder {load_dir}/global_stepN --output_folder {load_dir}/global_stepN_universal "
                          f"and write global_stepN_universal into {path}")
    step_dir = os.path.join(load_dir, tag)
    if not os.path.isdir(os.path.join(step_dir, "zero")):
        raise ConfigError(f"{where}: {step_dir}/zero does not exist; {path} must name the output folder of "
                          f"DeepSpeed's ds_to_universal.py")
    return tag


def check_universal_load(load_dir: str, shape: ModelShape, zero_stage: int) -> tuple[str, CheckpointLayout, dict]:
    """Before the model is built: the universal checkpoint exists, holds this model's shape, and
    this run's optimizer is one DeepSpeed loads universal checkpoints into. Returns the tag, the
    saved layout and the saved ds_config."""
    where = f"--universal-checkpoint --load {load_dir}"
    if shape.is_moe:
        raise ConfigError(f"{where}: DeepSpeed's universal checkpoint does not hold native MoE experts; "
                          f"resume a mixture-of-experts checkpoint with --load alone")
    if zero_stage not in (1, 2):
        raise ConfigError(f"{where}: DeepSpeed loads universal checkpoints into ZeRO's optimizer only (this run "
                          f"has ZeRO stage {zero_stage}); add --zero-stage 1 or resume with --load alone")
    tag = read_universal_tag(load_dir)
    step_dir = os.path.join(load_dir, tag)
    mp_files = sorted(f for f in os.listdir(step_dir) if f.startswith("mp_rank_") and f.endswith("_model_states.pt"))
    if not mp_files:
        raise ConfigError(f"{where}: {step_dir} holds no mp_rank_*_model_states.pt")
    state = load_shard(os.path.join(step_dir, mp_files[0]))
    saved = state.get("layout")
    if saved is None:
        raise ConfigError(f"{where}: {step_dir}/{mp_files[0]} holds no layout; the checkpoint was not written by "
                          f"this trainer")
    layout = CheckpointLayout.from_dict(saved, f"{step_dir}/{mp_files[0]}")
    return tag, layout, json.loads(json.dumps(state.get("ds_config") or {}))
