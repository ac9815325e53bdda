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
from typing import TYPE_CHECKING, Any, cast

from megatron.checkpoint.config import CheckpointConfig, ResumePlan
from megatron.metrics.config import LoggingConfig
from megatron.model.shape import ModelShape
from megatron.runtime.parallel_layout import ParallelLayout
from megatron.runtime.precision import Precision
from megatron.schedules.curriculum import CurriculumSchedule
from megatron.schedules.learning_rates import schedule_lengths, weight_decay_samples, wsd_decay_lengths
from megatron.schedules.microbatches import train_samples

if TYPE_CHECKING:  # torch-free at import: tools/param_count.py validates flags without it
    pass


@dataclass(frozen=True)
class BatchSchedule:
    micro_batch_size: int
    global_batch_size: int
    rampup_batch_size: tuple[int, int, int] | None  # (start batch, increment, ramp-up samples)
    seq_length: int
    train_iters: int | None
    train_samples: int | None
    train_tokens: int | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BatchSchedule":
        return cls(args.micro_batch_size, args.global_batch_size,
                   tuple(args.rampup_batch_size) if args.rampup_batch_size else None,
                   args.seq_length, args.train_iters, args.train_samples, args.train_tokens)


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
    create_moe_param_group: bool  # the experts in parameter groups of their own (DeepSpeed's ZeRO needs it)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "OptimizerSettings":
        return cls(args.optimizer, args.lr, args.min_lr, args.lr_decay_style, args.weight_decay, args.clip_grad,
                   args.adam_beta1, args.adam_beta2, args.adam_eps, args.sgd_momentum, args.zero_stage,
                   bool(getattr(args, "create_moe_param_group", False)))


@dataclass(frozen=True)
class LRSchedule:
    """The learning-rate schedule (megatron/schedules/learning_rates.py: AnnealingLR) in samples, or in
    tokens where --lr-warmup-tokens / --lr-decay-tokens give them."""
    max_lr: float
    min_lr: float
    decay_style: str
    warmup_samples: int
    decay_samples: int
    warmup_tokens: int | None
    decay_tokens: int | None
    tokens_per_sample: int
    use_checkpoint_scheduler: bool  # --use-checkpoint-opt_param-scheduler
    override_scheduler: bool        # --override-opt_param-scheduler
    wsd_decay_samples: int | None = None  # WSD's cool-down (--lr-wsd-decay-iters x the batch / -samples)
    wsd_decay_tokens: int | None = None   # --lr-wsd-decay-tokens
    wsd_decay_style: str = "exponential"  # --lr-wsd-decay-style
    # Megatron's weight-decay increment over the run's samples (--start/--end-weight-decay,
    # --weight-decay-incr-style; constant: --weight-decay at both ends)
    start_wd: float | None = None
    end_wd: float | None = None
    wd_incr_samples: int | None = None
    wd_incr_style: str = "constant"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LRSchedule":
        (warmup, decay), (warmup_tokens, decay_tokens) = schedule_lengths(args)
        wsd_samples, wsd_tokens = wsd_decay_lengths(args)
        return cls(args.lr, args.min_lr, args.lr_decay_style, warmup, decay, warmup_tokens, decay_tokens,
                   args.seq_length, args.use_checkpoint_opt_param_scheduler, args.override_opt_param_scheduler,
                   wsd_samples, wsd_tokens, args.lr_wsd_decay_style,
                   args.start_weight_decay, args.end_weight_decay, weight_decay_samples(args),
                   args.weight_decay_incr_style)


@dataclass(frozen=True)
class EvaluationSettings:
    """When the Trainer evaluates (every --eval-interval iterations, and at the end) and on how many
    batches (--eval-iters; 0: never)."""
    eval_interval: int | None
    eval_iters: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EvaluationSettings":
        return cls(args.eval_interval, args.eval_iters)


@dataclass(frozen=True)
class DataSettings:
    """What the data iterators (megatron/training/data_iterators.py) and the skipped iterations read; the
    dataset provider keeps its own flags (--data-path, --split, ...)."""
    micro_batch_size: int
    global_batch_size: int
    train_samples: int  # what the training split is sized for (megatron/schedules/microbatches.py: train_samples)
    num_workers: int
    valid_num_workers: int | None
    skip_train_iteration_range: tuple[tuple[int, int], ...] | None  # inclusive iteration ranges

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DataSettings":
        skipped = args.skip_train_iteration_range
        return cls(args.micro_batch_size, args.global_batch_size, train_samples(args), args.num_workers,
                   args.valid_num_workers,
                   tuple(tuple(r) for r in skipped) if skipped else None)


@dataclass(frozen=True)
class ExitSettings:
    """What stops a run before its schedule ends (the schedule's own end: BatchSchedule)."""
    exit_interval: int | None
    exit_duration_in_mins: float | None
    kill_switch_path: str | None
    exit_signal_handler: bool = False  # stop signals handled without --save too, exit_signal among them
    exit_signal: str = "SIGTERM"
    check_for_nan_in_loss_and_grad: bool = True  # stop on a non-finite loss or gradient norm
    check_for_spiky_loss: bool = False  # stop on a loss 10x the largest of the run's first 100

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ExitSettings":
        return cls(args.exit_interval, args.exit_duration_in_mins, getattr(args, "kill_switch_path", None),
                   args.exit_signal_handler, args.exit_signal, args.check_for_nan_in_loss_and_grad,
                   check_for_spiky_loss=args.check_for_spiky_loss)


@dataclass(frozen=True)
class Recompute:
    """Activation recompute as validation resolved it (--checkpoint-activations, Megatron-LM's
    --recompute-* spellings and the ds_config's activation_checkpointing agree on these three)."""
    checkpoint_activations: bool
    method: str | None       # --activations-checkpoint-method: uniform / block, or None
    num_layers: int          # --checkpoint-num-layers: layers per checkpointed chunk

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Recompute":
        return cls(bool(args.checkpoint_activations), args.activations_checkpoint_method, args.checkpoint_num_layers)


@dataclass(frozen=True)
class TensorParallelOptions:
    """What the Trainer installs on the built model across its TP ranks: Megatron's sequence
    parallelism (--sequence-parallel: norms and row-parallel biases see one sequence shard each, so
    their gradients are all-reduced over TP) and --sync-tp-duplicated-parameters."""
    sequence_parallel: bool
    sync_duplicated_parameters: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TensorParallelOptions":
        return cls(bool(args.sequence_parallel), bool(args.sync_tp_duplicated_parameters))


@dataclass(frozen=True)
class RunConfig:
    model_shape: ModelShape  # with the tokenizer's vocab and the divisor a checkpoint asked for
    parallel: ParallelLayout
    precision: Precision
    batch: BatchSchedule
    optimizer: OptimizerSettings
    lr_schedule: LRSchedule
    data: DataSettings
    evaluation: EvaluationSettings
    exit: ExitSettings
    deepspeed_config: Mapping[str, Any]  # read-only; deepspeed_config_dict() gives a copy to hand DeepSpeed
    resume: ResumePlan
    logging: LoggingConfig  # the metrics component's section (megatron/metrics/config.py)
    checkpoint: CheckpointConfig  # --save / --load and what they read and write (megatron/checkpoint/config.py)
    recompute: Recompute
    tensor_parallel: TensorParallelOptions
    # the ds_config's enabled legacy `curriculum_learning` (sequence-length warm-up, megatron/schedules/curriculum.py)
    curriculum: CurriculumSchedule | None = None

    def __post_init__(self) -> None:
        shape, layout = self.model_shape, self.parallel
        if (shape.tensor_model_parallel_size, shape.pipeline_model_parallel_size) != \
                (layout.tensor_model_parallel_size, layout.pipeline_model_parallel_size):
            raise RuntimeError(f"the model shape's TP x PP {shape.tensor_model_parallel_size} x "
                               f"{shape.pipeline_model_parallel_size} differs from the parallel layout's "
                               f"{layout.tensor_model_parallel_size} x {layout.pipeline_model_parallel_size}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, parallel: ParallelLayout, resume: ResumePlan) -> "RunConfig":
        """`parallel`: the layout the process groups were built from (initialize_megatron)."""
        return cls(
            model_shape=args.model_shape,
            parallel=parallel,
            precision=Precision.from_args(args),
            batch=BatchSchedule.from_args(args),
            optimizer=OptimizerSettings.from_args(args),
            lr_schedule=LRSchedule.from_args(args),
            data=DataSettings.from_args(args),
            evaluation=EvaluationSettings.from_args(args),
            exit=ExitSettings.from_args(args),
            deepspeed_config=_read_only(args.deepspeed_config_dict),
            resume=resume,
            logging=LoggingConfig.from_args(args),
            checkpoint=CheckpointConfig.from_args(args, parallel, resume=resume),
            recompute=Recompute.from_args(args),
            tensor_parallel=TensorParallelOptions.from_args(args),
            curriculum=getattr(args, "curriculum", None),
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


def _layout_value(name: str) -> property:
    return property(lambda self: getattr(self.run_config.parallel, name))


class FrozenArgs(RunArgs):
    """`args` after initialize_megatron: a late write raises, except the parameter-count cache
    (megatron/utils.py: COUNT_CACHE, once); the Trainer keeps the run's state on itself."""

    # the parallel sizes read the layout, their one owner after initialization (ParallelLayout)
    tensor_model_parallel_size = _layout_value("tensor_model_parallel_size")
    pipeline_model_parallel_size = _layout_value("pipeline_model_parallel_size")
    data_parallel_size = _layout_value("data_parallel_size")
    world_size = _layout_value("world_size")
    rank = _layout_value("rank")
    ds_pipeline_enabled = _layout_value("ds_pipeline_enabled")

    def __setattr__(self, name: str, value: Any) -> None:
        from megatron.utils import COUNT_CACHE
        if name in COUNT_CACHE and name in vars(self):
            raise FrozenArgsError(f"args.{name}: the parameter-count cache is written once, when the model is built "
                                  f"(megatron/utils.py: cache_parameter_counts)")
        if name not in COUNT_CACHE:
            raise FrozenArgsError(f"args.{name}: args is read-only after initialize_megatron (the run configuration "
                                  f"is args.run_config, megatron/config/run_config.py); only the parameter-count cache "
                                  f"(megatron/utils.py) is written later")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        raise FrozenArgsError(f"args.{name}: args is read-only after initialize_megatron")


def as_run_args(args: argparse.Namespace) -> RunArgs:
    """Validation's result: the same object, its shape-derived names now reading args.model_shape."""
    args.__class__ = RunArgs
    return cast(RunArgs, args)


def freeze_args(args: RunArgs, run_config: RunConfig) -> FrozenArgs:
    """The last step of initialize_megatron: args.run_config is set, then args turns read-only."""
    args.run_config = run_config
    args.__class__ = FrozenArgs
    return cast(FrozenArgs, args)
