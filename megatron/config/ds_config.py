"""The ds_config reconciled with the flags: a given --deepspeed_config must agree with them (batch
sizes, precision, ZeRO, gradient clipping, curriculum), and without one it is built from them, so
DeepSpeed and the trainer read one configuration."""
import argparse
import json
import os

from megatron.runtime.refusal import ConfigError
from megatron.runtime.refusal import require as _require


def _stage_boundaries_whole(config, where):
    """DeepSpeed's pipeline engine by default sends 1/TP of a stage's output from each TP rank and
    all-gathers it on the next stage (pipeline.pipe_partitioned / grad_partitioned), which assumes
    the TP ranks hold the same tensor; under sequence parallelism each holds its own shard."""
    pipeline = config.setdefault("pipeline", {})
    for key in ("pipe_partitioned", "grad_partitioned"):
        _require(not pipeline.get(key, False),
                 f"{where}: pipeline.{key}=true does not work with --sequence-parallel (each TP rank sends its own "
                 f"sequence shard between stages): set it to false or drop --sequence-parallel")
        pipeline[key] = False


def _apply_deepspeed_config(args):
    """Load --deepspeed_config (or build one from the flags) and make it agree with the flags:
    a mismatch is an error, never a silently different run."""
    if args.deepspeed_config:
        _require(os.path.isfile(args.deepspeed_config), f"--deepspeed_config {args.deepspeed_config}: no such file")
        with open(args.deepspeed_config) as f:
            try:
                config = json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--deepspeed_config {args.deepspeed_config}: invalid JSON ({e})") from None
    else:
        config = {}
    where = f"--deepspeed_config {args.deepspeed_config}" if args.deepspeed_config else "ds_config"
    _take_curriculum(config, where, args)

    gas = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    for key, ours, flag in (("train_micro_batch_size_per_gpu", args.micro_batch_size, "--micro-batch-size"),
                            ("train_batch_size", args.global_batch_size, "--global-batch-size"),
                            ("gradient_accumulation_steps", gas, "--global-batch-size")):
        _require(key not in config or config[key] == ours,
                 f"{where}: {key}={config.get(key)} disagrees with {flag} (implies {ours}); make them match")
        config[key] = ours
    for key, flag in (("fp16", "--fp16"), ("bf16", "--bf16")):
        if key not in config:
            continue  # filled in from the flag below
        enabled = bool(config[key].get("enabled", False))
        _require(enabled == getattr(args, key),
                 f"{where}: {key}.enabled={enabled} disagrees with {flag}={getattr(args, key)}; make them match")
    if args.fp16 and "fp16" not in config:
        config["fp16"] = {"enabled": True, "loss_scale": args.loss_scale or 0,
                          "initial_scale_power": int(args.initial_loss_scale).bit_length() - 1,
                          "loss_scale_window": args.loss_scale_window, "hysteresis": args.hysteresis,
                          "min_loss_scale": args.min_loss_scale}
    if args.bf16 and "bf16" not in config:
        config["bf16"] = {"enabled": True}
    if not args.deepspeed_config:
        config["gradient_clipping"] = args.clip_grad  # no ds_config: the flag clips, as Megatron's optimizer does
    if args.sequence_parallel:
        _stage_boundaries_whole(config, where)
    zero = config.setdefault("zero_optimization", {})
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    _take_zero_flags(zero, where, args)
    args.zero_stage = zero.setdefault("stage", 0)
    _refuse_offload(zero, where)
    _require(args.zero_stage in (0, 1, 2, 3), f"{where}: zero_optimization.stage {args.zero_stage} does not exist: "
                                              f"use 0, 1, 2 or 3")
    if args.optimizer == "sgd" and args.zero_stage > 0:
        # DeepSpeed's ZeRO refuses optimizers outside its tested list unless told; --optimizer sgd is explicit
        config.setdefault("zero_allow_untested_optimizer", True)
    _require(not (args.model_shape.is_moe and args.zero_stage > 0 and not args.create_moe_param_group),
             f"ZeRO stage {args.zero_stage} with MoE needs --create-moe-param-group (the experts' own optimizer "
             f"parameter groups)")
    # the pipeline engine wraps a bf16 model in DeepSpeed's BF16_Optimizer, which asserts the same
    _require(not (args.model_shape.is_moe and args.bf16 and not args.no_pipeline_parallel
                  and not args.create_moe_param_group),
             "--bf16 with MoE on the pipeline engine needs --create-moe-param-group (DeepSpeed's BF16_Optimizer "
             "keeps the experts in their own optimizer parameter groups)")
    _require(not (args.zero_stage > 1 and not args.no_pipeline_parallel),
             f"ZeRO stage {args.zero_stage} does not work with DeepSpeed's pipeline engine: use "
             f"--zero-stage 0 or 1, or --no-pipeline-parallel")
    _require(not (args.sync_tp_duplicated_parameters and args.zero_stage == 3),
             "--sync-tp-duplicated-parameters does not work with ZeRO stage 3 (its parameters are partitioned "
             "when the sync runs): use --zero-stage 0, 1 or 2")
    _require(not (args.universal_checkpoint and not args.load), "--universal-checkpoint needs --load DIR")
    if args.universal_checkpoint:
        config.setdefault("checkpoint", {})["load_universal"] = True
    if args.accumulate_allreduce_grads_in_fp32:
        # Megatron's fp32 gradient accumulation buffer; with DeepSpeed the ds_config's key (Argonne's
        # launchers set both); whether DeepSpeed runs it is checked once the config is parsed
        config.setdefault("data_types", {}).setdefault("grad_accum_dtype", "fp32")
    config.setdefault("steps_per_print", 10 ** 9)  # our own log line reports progress
    config.setdefault("wall_clock_breakdown", False)
    args.clip_grad = _check_with_deepspeed(config, where, args)
    args.deepspeed_config_dict = config


# the forks' --zero-* flags and the zero_optimization keys they stand for; a flag at its default
# (off, 0) says nothing and leaves the key to the ds_config (or DeepSpeed's default)
ZERO_FLAGS = (("--zero-reduce-scatter", "zero_reduce_scatter", "reduce_scatter"),
              ("--zero-contigious-gradients", "zero_contigious_gradients", "contiguous_gradients"),
              ("--zero-reduce-bucket-size", "zero_reduce_bucket_size", "reduce_bucket_size"),
              ("--zero-allgather-bucket-size", "zero_allgather_bucket_size", "allgather_bucket_size"))


def _take_zero_flags(zero, where, args):
    """A given --zero-* flag fills its zero_optimization key; a ds_config holding another value is
    one line (as for the batch sizes), never a silently different run."""
    for flag, dest, key in ZERO_FLAGS:
        value = getattr(args, dest)
        if not value:
            continue
        _require(key not in zero or zero[key] == value,
                 f"{where}: zero_optimization.{key}={zero.get(key)} disagrees with {flag} ({value}); make them match")
        zero[key] = value
    # DeepSpeed's ZeRO 1 / 2 asserts this at engine build (its nccl_start_alignment_factor)
    gather = zero.get("allgather_bucket_size")
    _require(not (isinstance(gather, int) and gather % 2),
             f"{where}: zero_optimization.allgather_bucket_size {gather} (--zero-allgather-bucket-size) must be a "
             f"multiple of 2 (DeepSpeed's alignment of the gathered partitions): use {gather + 1 if gather else 2}")


def _refuse_offload(zero, where):
    """ZeRO-Offload (optimizer state or parameters in host memory or on NVMe) is refused in one line
    instead of DeepSpeed's exception at engine build: DeepSpeed runs an offloaded step with its CPU
    Adam, which this trainer does not build (as --cpu-optimizer, refused too), and the memory table
    counts device-resident state. The deprecated boolean spellings count as well."""
    for key in ("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"):
        value = zero.get(key)
        device = value.get("device", "none") if isinstance(value, dict) else ("cpu" if value else "none")
        _require(device == "none",
                 f"{where}: zero_optimization.{key} (device {device}): ZeRO-Offload is not supported by this "
                 f"trainer (DeepSpeed's CPU Adam is not built here, as for --cpu-optimizer); remove it or set "
                 f"its device to none")


def _take_curriculum(config, where, args):
    """The legacy top-level `curriculum_learning` block (both forks' sequence-length warm-up) is ours
    to run (megatron/schedules/curriculum.py): DeepSpeed 0.19 rejects the key, so it leaves the config here.
    A disabled block is dropped with a startup note; an enabled one becomes args.curriculum."""
    from megatron.schedules.curriculum import parse_curriculum
    args.curriculum = None
    if "curriculum_learning" not in config:
        return
    block = config.pop("curriculum_learning")
    args.curriculum = parse_curriculum(block, where, args.seq_length)
    if args.curriculum is None:
        args.startup_notes = getattr(args, "startup_notes", []) + [
            f"{where}: curriculum_learning is disabled (\"enabled\": false): dropped (DeepSpeed "
            f"0.19 no longer accepts the key; an enabled block runs the sequence-length warm-up)"]


def _check_grad_accum_dtype(config, accum, where, args):
    """data_types.grad_accum_dtype (or --accumulate-allreduce-grads-in-fp32) where DeepSpeed 0.19.8
    runs it: the model's own dtype, or fp32 for 16-bit weights with ZeRO (stage 1 with bf16:
    BF16_Optimizer's fp32 accumulator; stage 2 / 3: the ZeRO optimizer accumulates in fp32). At
    stage 0 its engine raises NotImplementedError on the mix; here it is one line first. Written
    back by the dtype's canonical name, which the memory table reads."""
    if accum is None:
        return
    config["data_types"]["grad_accum_dtype"] = accum
    check_grad_accum_dtype(accum, args, where)


def check_grad_accum_dtype(accum: str, args: argparse.Namespace, where: str = "ds_config") -> None:
    """The rule of _check_grad_accum_dtype, torch-free (tools/param_count.py applies it to the flag)."""
    _require(not args.accumulate_allreduce_grads_in_fp32 or accum == "fp32",
             f"{where}: data_types.grad_accum_dtype={accum} disagrees with --accumulate-allreduce-grads-in-fp32; "
             f"make them match")
    model = "fp16" if args.fp16 else ("bf16" if args.bf16 else "fp32")
    source = ("--accumulate-allreduce-grads-in-fp32" if args.accumulate_allreduce_grads_in_fp32
              else f"{where}: data_types.grad_accum_dtype={accum}")
    _require(accum in (model, "fp32"), f"{source}: DeepSpeed accumulates {model} gradients in {model} or fp32 "
                                       f"only; use fp32 or drop the key")
    _require(accum == model or args.zero_stage > 0,
             f"{source} with {model} weights needs ZeRO: DeepSpeed accumulates {model} gradients in fp32 only in its "
             f"ZeRO / BF16 optimizers (at stage 0 it refuses the mix); use --zero-stage 1")


def _check_with_deepspeed(config, where, args):
    """The installed DeepSpeed parses the config now, before anything is built: a key it rejects
    (e.g. a removed top-level block such as `compression_training`) is one line.
    Returns the clipping DeepSpeed applies. Both forks hand DeepSpeed the bare optimizer, so a
    given ds_config alone decides the clipping (its `gradient_clipping`, else DeepSpeed's default);
    a different --clip-grad is reported, not used: the same script trains the same way here."""
    import deepspeed

    from megatron.runtime.deepspeed_internals import grad_accum_dtype_name, parsed_config
    # the batch keys depend on the world size, which DeepSpeed cannot see yet (they are checked above)
    probe = {k: v for k, v in config.items() if k not in ("train_batch_size", "gradient_accumulation_steps")}
    try:
        parsed = parsed_config(probe)
        clip = float(parsed.gradient_clipping)
        accum = grad_accum_dtype_name(parsed)
    except Exception as e:  # DeepSpeedConfigError, pydantic's ValidationError, a bad value's own error
        errors = getattr(e, "errors", None)
        detail = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in errors()) if errors \
            else str(e).splitlines()[0]
        raise ConfigError(f"{where}: DeepSpeed {deepspeed.__version__} rejects it: {detail}") from None
    _check_grad_accum_dtype(config, accum, where, args)
    if "--clip-grad" in getattr(args, "given_flags", ()) and args.clip_grad != clip:
        args.startup_notes = getattr(args, "startup_notes", []) + [
            f"--clip-grad {args.clip_grad} is not used: DeepSpeed clips at {clip} (the ds_config's gradient_clipping"
            f"{'' if 'gradient_clipping' in config else ', absent: DeepSpeed default'}), as in Megatron-DeepSpeed"]
    return clip
