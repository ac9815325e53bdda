"""The metrics component's section of the run configuration (torch-free): everything the log line,
the TensorBoard scalars, the memory report and MFU read, built once from the flags at the end of
initialize_megatron (RunConfig.from_args) and frozen. The parameter counts and FLOPs per sample
are not here: they are known once the model is built, and the mission caches them on `args`
(megatron/utils.py), where the logger reads them."""
import os
from argparse import Namespace
from dataclasses import dataclass

from megatron.metrics.memory import TrainingSetup
from megatron.metrics.mfu import MfuSettings, resolve_mfu, with_flops_convention
from megatron.model.shape import ModelShape


@dataclass(frozen=True)
class LoggingConfig:
    log_interval: int
    tensorboard_dir: str | None
    tensorboard_queue_size: int
    writes_tensorboard: bool  # --tensorboard-dir and this is the last rank (it sees the loss under PP)
    log_batch_size_to_tensorboard: bool
    log_timers_to_tensorboard: bool
    log_validation_ppl_to_tensorboard: bool
    log_params_norm: bool
    log_num_zeros_in_grad: bool
    log_optimizer_states_to_tensorboard: bool
    world_size: int          # TFLOPs and MFU are per device
    data_parallel_size: int  # the per-replica rates
    seq_length: int          # tokens per sample
    model_shape: ModelShape  # MoE's extra scalars; what the memory prediction is for
    memory: TrainingSetup    # what the memory prediction is made for, without the engine's fused Adam
    mfu: MfuSettings         # the device's peak and the startup line naming it
    # the forks' TensorBoard switches: the fp16 loss scale (on unless --no-log-loss-scale-to-tensorboard),
    # torch.cuda.memory_stats() and the world size
    log_loss_scale_to_tensorboard: bool = True
    log_memory_to_tensorboard: bool = False
    log_world_size_to_tensorboard: bool = False
    timing_log_option: str | None = None  # --timing-log-option: every rank's iteration time (rank_timing.py)
    log_progress: bool = False            # --log-progress: progress.txt in --save (progress_log.py)
    # --wandb-project / --wandb-exp-name / --wandb-save-dir: the same scalars to W&B, from the rank that
    # writes TensorBoard (the last); its run config: the flags' plain values
    writes_wandb: bool = False
    wandb_project: str = ""
    wandb_exp_name: str = ""
    wandb_entity: str = ""  # "": wandb's default entity
    wandb_dir: str = ""
    wandb_config: tuple = ()

    @classmethod
    def from_args(cls, args: Namespace) -> "LoggingConfig":
        """From validated flags (the device's peak for MFU: --peak-tflops, or a CUDA query)."""
        precision = "fp16" if args.fp16 else ("bf16" if args.bf16 else "fp32")
        return cls(log_interval=args.log_interval, tensorboard_dir=args.tensorboard_dir,
                   tensorboard_queue_size=args.tensorboard_queue_size,
                   writes_tensorboard=bool(args.tensorboard_dir) and args.rank == args.world_size - 1,
                   log_batch_size_to_tensorboard=args.log_batch_size_to_tensorboard,
                   log_timers_to_tensorboard=args.log_timers_to_tensorboard,
                   log_validation_ppl_to_tensorboard=args.log_validation_ppl_to_tensorboard,
                   log_params_norm=args.log_params_norm, log_num_zeros_in_grad=args.log_num_zeros_in_grad,
                   log_optimizer_states_to_tensorboard=args.log_optimizer_states_to_tensorboard,
                   log_progress=args.log_progress, timing_log_option=args.timing_log_option,
                   writes_wandb=bool(args.wandb_project) and args.rank == args.world_size - 1,
                   wandb_project=args.wandb_project, wandb_exp_name=args.wandb_exp_name,
                   wandb_entity=args.wandb_entity,
                   wandb_dir=args.wandb_save_dir or (os.path.join(args.save, "wandb") if args.save else ""),
                   wandb_config=tuple((k, v) for k, v in sorted(vars(args).items())
                                      if isinstance(v, (bool, int, float, str, type(None)))),
                   world_size=args.world_size, data_parallel_size=args.data_parallel_size,
                   seq_length=args.seq_length, model_shape=args.model_shape,
                   memory=TrainingSetup.from_args(args),
                   mfu=with_flops_convention(resolve_mfu(precision, args.peak_tflops),
                                             causal=args.flops_attention == "causal"),
                   log_loss_scale_to_tensorboard=args.log_loss_scale_to_tensorboard,
                   log_memory_to_tensorboard=args.log_memory_to_tensorboard,
                   log_world_size_to_tensorboard=args.log_world_size_to_tensorboard)
