"""What a --save directory holds besides DeepSpeed's shards, described once: the file names, the
tracker files (one reader, one writer) and the layout a checkpoint was saved with (a frozen
dataclass, serialised to megatron_layout.json and into every mp_rank file's client state).

  DIR/global_stepN/...                     DeepSpeed's files for iteration N (reshard.py)
  DIR/global_stepN/megatron_layout.json    CheckpointLayout.to_dict(): the shape and how it was cut
  DIR/global_stepN/megatron_model.json     numerics and tokenizer, for tools (write_model_info)
  DIR/latest                               "global_stepN", the tag DeepSpeed's own tools read
  DIR/latest_checkpointed_iteration.txt    "N", the tracker Megatron reads
  DIR/latest_universal                     the tag of DeepSpeed's ds_to_universal.py output
  DIR/global_stepN.suspect                 untracked: its weights gave a bad loss (writer.untrack)
Key names and values on disk are the ones checkpoints have always carried, so every checkpoint
written before loads; tests/unit/test_checkpoint_files.py holds them by hand.
Torch-free: tools read layouts without building anything.
"""
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from megatron.model.partition import DEFAULT_METHOD
from megatron.model.shape import ModelShape, gpt2_variant
from megatron.runtime.atomic_write import write_atomic
from megatron.runtime.refusal import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"
LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"
LAYOUT_FILE = "megatron_layout.json"
MODEL_FILE = "megatron_model.json"

# Each layout key belongs to one group:
#   shape     must match for the saved tensors to fit the model being built
#   parallel  how the model was cut: another value is resharded on load (the padded vocab follows
#             the TP size, and is kept as saved)
#   variant   the architecture variant; a checkpoint written before variants existed is a GPT-2
#   moe       shape keys written for a mixture-of-experts model only (dense checkpoints lack them)
SHAPE, PARALLEL, VARIANT, MOE = "shape", "parallel", "variant", "moe"


def _key(group: str, default: Any = dataclasses.MISSING, written_if_none: bool = True, omitted: tuple = ()) -> Any:
    """omitted: values not written (a key that only a newer model variant needs is left out where
    it has its old meaning, so the files of a model without it stay as they were)."""
    return field(default=default, metadata={"group": group, "written_if_none": written_if_none, "omitted": omitted})


@dataclass(frozen=True)
class CheckpointLayout:
    """The model shape and parallel layout a checkpoint was saved with. Field order is the order
    of the keys on disk; a None moe / split field is a key the file does not have."""
    num_layers: int = _key(SHAPE)
    hidden_size: int = _key(SHAPE)
    ffn_hidden_size: int = _key(SHAPE)
    num_attention_heads: int = _key(SHAPE)
    padded_vocab_size: int = _key(PARALLEL)
    max_position_embeddings: int = _key(SHAPE)
    tensor_model_parallel_size: int = _key(PARALLEL)
    pipeline_model_parallel_size: int = _key(PARALLEL)
    ds_pipeline_enabled: bool = _key(PARALLEL)
    num_experts: list[int] | None = _key(MOE, None, written_if_none=False)
    expert_interval: int | None = _key(MOE, None, written_if_none=False)
    topk: int | None = _key(MOE, None, written_if_none=False)
    mlp_type: str | None = _key(MOE, None, written_if_none=False)
    moe_expert_parallel_size: int | None = _key(MOE, None, written_if_none=False)
    enable_expert_tensor_parallelism: bool | None = _key(MOE, None, written_if_none=False)
    # defaults: GPT-2's (a file written before variants existed); num_key_value_heads and
    # kv_channels follow the heads and hidden size (from_dict fills them)
    position_embedding_type: str = _key(VARIANT, "absolute")
    rotary_percent: float = _key(VARIANT, 1.0)
    glu_activation: str | None = _key(VARIANT, None)
    normalization: str = _key(VARIANT, "layernorm")
    embed_layernorm: bool = _key(VARIANT, False)
    add_bias_linear: bool = _key(VARIANT, True)
    add_qkv_bias: bool = _key(VARIANT, False, omitted=(False,))  # written where the model has it
    num_key_value_heads: int | None = _key(VARIANT, None)
    kv_channels: int | None = _key(VARIANT, None)
    untie_embeddings_and_output_weights: bool = _key(VARIANT, False)
    # the same tensors, another function (issue 39): written where the model has them
    activation: str = _key(VARIANT, "gelu", omitted=("gelu",))
    apply_residual_connection_post_layernorm: bool = _key(VARIANT, False, omitted=(False,))
    apply_layernorm_1p: bool = _key(VARIANT, False, omitted=(False,))
    # which stage holds which layer: recorded where it decides the files (the pipeline engine at PP > 1)
    pp_partition_method: str | None = _key(PARALLEL, None, written_if_none=False)

    @classmethod
    def from_shape(cls, shape: ModelShape, ds_pipeline_enabled: bool) -> "CheckpointLayout":
        """The layout a run with this (vocab-complete) shape saves."""
        values = {f.name: getattr(shape, f.name) for f in dataclasses.fields(cls)
                  if f.metadata["group"] in (SHAPE, VARIANT)}
        if shape.is_moe:
            values.update({f.name: getattr(shape, f.name) for f in dataclasses.fields(cls)
                           if f.metadata["group"] == MOE})
            values["num_experts"] = list(shape.num_experts)
        split = ds_pipeline_enabled and shape.pipeline_model_parallel_size > 1
        return cls(**values, padded_vocab_size=shape.padded_vocab_size,
                   tensor_model_parallel_size=shape.tensor_model_parallel_size,
                   pipeline_model_parallel_size=shape.pipeline_model_parallel_size,
                   ds_pipeline_enabled=ds_pipeline_enabled,
                   pp_partition_method=(shape.pp_partition_method or DEFAULT_METHOD) if split else None)

    @classmethod
    def from_dict(cls, saved: dict, where: str) -> "CheckpointLayout":
        """A saved layout; keys a newer trainer wrote, or missing ones, fail in one line naming them."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(saved) - set(names))
        if unknown:
            raise ConfigError(f"{where}: layout keys {', '.join(f'{k}={saved[k]}' for k in unknown)} are unknown to "
                              f"this version of the code; read it with the trainer version that wrote it")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [k for k in required if k not in saved]
        if missing:
            raise ConfigError(f"{where}: layout keys {', '.join(missing)} are missing; the checkpoint was not written "
                              f"by this trainer")
        values = {**gpt2_variant(saved["num_attention_heads"], saved["hidden_size"]), **saved}
        if values["ds_pipeline_enabled"] and values["pipeline_model_parallel_size"] > 1:
            # saved at PP > 1 before the split was recorded: split by type:transformer then
            values.setdefault("pp_partition_method", "type:transformer")
        return cls(**values)

    def to_dict(self) -> dict:
        """The keys and values as written to megatron_layout.json and the client state."""
        return {f.name: value for f in dataclasses.fields(self) for value in [getattr(self, f.name)]
                if (value is not None or f.metadata["written_if_none"])
                and value not in f.metadata["omitted"]}

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    def shape_differences(self, now: "CheckpointLayout") -> list[tuple[str, Any, Any]]:
        """(key, saved value, this run's) of every non-parallel key that differs: the variant keys
        first, then the sizes and experts (the order the refusal has always listed them in)."""
        saved, ours = self.to_dict(), now.to_dict()
        group = {f.name: f.metadata["group"] for f in dataclasses.fields(self)}
        keys = [k for k in saved if group[k] == VARIANT] + [k for k in saved if group[k] != VARIANT] + list(ours)
        return [(k, getattr(self, k), getattr(now, k)) for k in dict.fromkeys(keys)
                if group[k] != PARALLEL and getattr(self, k) != getattr(now, k)]

    def model_shape(self, seq_length: int | None = None) -> ModelShape:
        """The ModelShape the checkpoint was saved with. The saved (padded) vocab is its vocab:
        padding it again at its own TP size changes nothing."""
        shape_fields = ModelShape.__dataclass_fields__
        kwargs = {k: v for k, v in self.to_dict().items() if k in shape_fields and k != "vocab_size"}
        kwargs.update(vocab_size=self.padded_vocab_size, make_vocab_size_divisible_by=1,
                      seq_length=seq_length or self.max_position_embeddings)
        return ModelShape(**kwargs)

    def describe(self) -> str:
        engine = "" if self.ds_pipeline_enabled else ", no pipeline engine"
        return f"TP={self.tensor_model_parallel_size} x PP={self.pipeline_model_parallel_size}{engine}"


# --- files of one saved iteration ---------------------------------------------------------------
def step_tag(iteration: int) -> str:
    return f"global_step{iteration}"


def step_dir(save_dir: str, iteration: int) -> str:
    return os.path.join(save_dir, step_tag(iteration))


def write_layout(step_directory: str, layout: CheckpointLayout) -> None:
    write_atomic(os.path.join(step_directory, LAYOUT_FILE), json.dumps(layout.to_dict(), indent=1))


def read_layout(step_directory: str, where: str) -> CheckpointLayout:
    """megatron_layout.json of one saved iteration; `where` (e.g. "--load DIR") leads the error
    for a missing file, the file's path the one for keys this code does not know."""
    path = os.path.join(step_directory, LAYOUT_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"{where}: {path} is missing; the checkpoint was not written by this trainer")
    try:
        with open(path) as f:
            saved = json.load(f)
    except ValueError as e:  # truncated or overwritten: one line, not a JSON traceback
        raise ConfigError(f"{where}: {path} is unreadable ({type(e).__name__}: {e}); the checkpoint is damaged "
                          f"(restore the file from a copy, or resume from another iteration)") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{where}: {path} holds no layout; the checkpoint is damaged")
    return CheckpointLayout.from_dict(saved, path)


def write_model_info(step_directory: str, info: dict) -> None:
    """What a tool needs besides the layout to rebuild or export the model: numerics and the
    tokenizer (files by absolute path; CheckpointManager assembles it). Written by rank 0 next to
    megatron_layout.json."""
    write_atomic(os.path.join(step_directory, MODEL_FILE), json.dumps(info, indent=1))


def read_model_info(step_directory: str) -> dict:
    """megatron_model.json, or {} for a checkpoint written before it existed."""
    path = os.path.join(step_directory, MODEL_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def saved_iterations(save_dir: str) -> list[int]:
    """The iterations DIR holds a global_stepN directory of, in order."""
    names = os.listdir(save_dir) if os.path.isdir(save_dir) else []
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"global_step(\d+)", n) for n in names) if m)


def require_step_dir(load_dir: str, iteration: int, where: str) -> str:
    """global_stepN of DIR; a missing one (a tracker naming an iteration that is not there) is
    one line listing the iterations that are."""
    path = step_dir(load_dir, iteration)
    if not os.path.isdir(path):
        raise ConfigError(f"{where}: {path} does not exist (saved iterations: "
                          f"{', '.join(map(str, saved_iterations(load_dir))) or 'none'})")
    return path


# --- trackers -----------------------------------------------------------------------------------
def read_pointer(path: str) -> str | None:
    """The stripped text of a tracker file, None when there is none."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def read_tracker(load_dir: str, where: str) -> int | None:
    """The iteration latest_checkpointed_iteration.txt names, None without one."""
    text = read_pointer(os.path.join(load_dir, TRACKER))
    if text is not None and not text.isdigit():
        raise ConfigError(f"{where}: {TRACKER} holds '{text}', not an iteration number")
    return None if text is None else int(text)


def write_tracker(save_dir: str, iteration: int) -> None:
    """Points both trackers at iteration N, each replaced whole: called only once every rank has
    written global_stepN, so a crash before leaves the previous checkpoint as the one that loads."""
    write_atomic(os.path.join(save_dir, LATEST), step_tag(iteration))
    write_atomic(os.path.join(save_dir, TRACKER), str(iteration))
