"""The run's configuration as immutable values, built once at the end of initialize_megatron
(after the tokenizer's vocab and a checkpoint's padded vocab are known) and kept as
`args.run_config`. From then on `args` is read-only except for the parameter-count cache that
megatron/utils.py writes once the model is built: nothing downstream can change what a later
reader sees (Megatron-core's TransformerConfig, torchtitan's ParallelDims).

`args` keeps every flag's name for `get_args()` readers and launch scripts; the values derived
from the model's shape (ffn size, position table, kv heads, head dim, padded vocab, vocab divisor)
are read off `args.model_shape` instead of being copied onto it."""
import argparse
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from megatron.checkpoint.config import CheckpointConfig
from megatron.model.shape import ModelShape

if TYPE_CHECKING:  # torch-free at import: tools/param_count.py validates flags without it
    import torch


@dataclass(frozen=True)
class ParallelLayout:
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int  # DeepSpeed-MoE's EP (1 for a dense model); divides the DP size
    world_size: int
    rank: int
    ds_pipeline_enabled: bool  # DeepSpeed's PipelineModule (False: --no-pipeline-parallel)


@dataclass(frozen=True)
class Precision:
    fp16: bool
    bf16: bool
    params_dtype: "torch.dtype"

    @property
    def name(self) -> str:
        return "fp16" if self.fp16 else ("bf16" if self.bf16 else "fp32")


@dataclass(frozen=True)
class BatchSchedule:
    micro_batch_size: int
    global_batch_size: int
    rampup_batch_size: tuple[int, int, int] | None  # (start batch, increment, ramp-up samples)
    seq_length: int
    train_iters: int | None
    train_samples: int | None
    train_tokens: int | None


@dataclass(frozen=True)
class OptimizerSettings:
    optimizer: str  # adam or sgd
    lr: float
    min_lr: float
    lr_decay_style: str
    weight_decay: float
    clip_grad: float  # what DeepSpeed clips at (a given ds_config decides, see arguments.py)
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    sgd_momentum: float
    zero_stage: int


@dataclass(frozen=True)
class ResumePlan:
    """What --load found before the model was built (megatron/checkpoint/resume.py)."""
    universal_tag: str | None = None                 # --universal-checkpoint: the converted folder's tag
    reshard_source: tuple[str, int] | None = None    # (load dir, iteration) saved at another layout
    make_vocab_size_divisible_by: int | None = None  # the divisor that keeps the saved padded vocab


@dataclass(frozen=True)
class RunConfig:
    model_shape: ModelShape  # with the tokenizer's vocab and the divisor a checkpoint asked for
    parallel: ParallelLayout
    precision: Precision
    batch: BatchSchedule
    optimizer: OptimizerSettings
    deepspeed_config: Mapping[str, Any]  # read-only; deepspeed_config_dict() gives a copy to hand DeepSpeed
    resume: ResumePlan
    mfu: Any  # megatron.mfu.MfuSettings (model FLOPs per sample, the device's peak, where it came from)
    checkpoint: CheckpointConfig  # --save / --load and what they read and write

    @classmethod
    def from_args(cls, args: argparse.Namespace, resume: ResumePlan, mfu: Any) -> "RunConfig":
        shape = args.model_shape
        return cls(
            model_shape=shape,
            parallel=ParallelLayout(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                                    args.data_parallel_size, shape.moe_expert_parallel_size, args.world_size,
                                    args.rank, args.ds_pipeline_enabled),
            precision=Precision(args.fp16, args.bf16, args.params_dtype),
            batch=BatchSchedule(args.micro_batch_size, args.global_batch_size,
                                tuple(args.rampup_batch_size) if args.rampup_batch_size else None,
                                args.seq_length, args.train_iters, args.train_samples, args.train_tokens),
            optimizer=OptimizerSettings(args.optimizer, args.lr, args.min_lr, args.lr_decay_style, args.weight_decay,
                                        args.clip_grad, args.adam_beta1, args.adam_beta2, args.adam_eps,
                                        args.sgd_momentum, args.zero_stage),
            deepspeed_config=_read_only(args.deepspeed_config_dict),
            resume=resume,
            mfu=mfu,
            checkpoint=CheckpointConfig.from_args(args),
        )

    def deepspeed_config_dict(self) -> dict[str, Any]:
        """A plain, mutable copy (DeepSpeed may write into the dict it is given)."""
        return _plain(self.deepspeed_config)


def _read_only(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _read_only(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_read_only(v) for v in value)
    return copy.deepcopy(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


class RunArgs(argparse.Namespace):
    """`args` once validated: the shape-derived names read the shape, so they cannot disagree with
    it (the flags' own values, e.g. --ffn-hidden-size None for the default, stay in vars(args))."""
    ffn_hidden_size = property(lambda self: self.model_shape.ffn_hidden_size)
    max_position_embeddings = property(lambda self: self.model_shape.max_position_embeddings)
    num_key_value_heads = property(lambda self: self.model_shape.num_key_value_heads)
    kv_channels = property(lambda self: self.model_shape.kv_channels)
    make_vocab_size_divisible_by = property(lambda self: self.model_shape.make_vocab_size_divisible_by)

    @property
    def padded_vocab_size(self) -> int:
        if self.model_shape.vocab_size is None:  # as before the tokenizer is built: not there yet
            raise AttributeError("args.padded_vocab_size: the vocab is not known yet (build the tokenizer first)")
        return self.model_shape.padded_vocab_size


class FrozenArgsError(AttributeError):
    """A write onto args after initialize_megatron."""


class FrozenArgs(RunArgs):
    """`args` after initialize_megatron: a late write raises, except the parameter-count cache
    (megatron/utils.py: COUNT_CACHE, once); the Trainer keeps the run's state on itself."""

    def __setattr__(self, name: str, value: Any) -> None:
        from megatron.utils import COUNT_CACHE
        if name in COUNT_CACHE and name in vars(self):
            raise FrozenArgsError(f"args.{name}: the parameter-count cache is written once, when the model is built "
                                  f"(megatron/utils.py: cache_parameter_counts)")
        if name not in COUNT_CACHE:
            raise FrozenArgsError(f"args.{name}: args is read-only after initialize_megatron (the run configuration "
                                  f"is args.run_config, megatron/run_config.py); only the parameter-count cache "
                                  f"(megatron/utils.py) is written later")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise FrozenArgsError(f"args.{name}: args is read-only after initialize_megatron")


def as_run_args(args: argparse.Namespace) -> RunArgs:
    """Validation's result: the same object, its shape-derived names now reading args.model_shape."""
    args.__class__ = RunArgs
    return args


def freeze_args(args: RunArgs, run_config: RunConfig) -> FrozenArgs:
    """The last step of initialize_megatron: args.run_config is set, then args turns read-only."""
    args.run_config = run_config
    args.__class__ = FrozenArgs
    return args
