"""The flags' rules, checked once before any heavy work: each flag's own range, then every
combination (layout, batch sizes, training length, precision, data, MoE, sequence parallelism),
each refused in one line naming the flag and the fix (ConfigError). The ds_config is reconciled
with the flags at the end (megatron/config/ds_config.py)."""
import argparse
import math
import os
from typing import cast

from megatron.config.ds_config import _apply_deepspeed_config
from megatron.config.run_config import RunArgs, as_run_args
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError, require_fraction, require_non_negative, require_positive
from megatron.runtime.refusal import require as _require
from megatron.tokenizer.external import PATH_FLAG, tokenizer_path


def _int(text, flag):
    try:
        return int(str(text).replace("_", ""))
    except ValueError:
        raise ConfigError(f"{flag}: '{text}' is not an integer") from None



# The value rule of every size, count, interval and fraction flag that is not a field of the model's
# shape (ModelShape checks those). Checked by validate_flag_values, which tools/param_count.py
# shares: a flag the caller's parser does not define is skipped.
POSITIVE = ("--micro-batch-size", "--global-batch-size", "--train-iters", "--train-samples", "--exit-interval",
            "--exit-duration-in-mins", "--checkpoint-num-layers", "--activations-checkpoint-num-layers",
            "--lr-decay-iters", "--lr-decay-samples", "--save-interval", "--eval-interval", "--train-tokens",
            "--lr-decay-tokens", "--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--lr-wsd-decay-tokens",
            "--log-interval", "--tensorboard-queue-size", "--tensorboard-log-interval",
            "--ds-sequence-parallel-size", "--adam-eps", "--layernorm-epsilon", "--init-method-std",
            "--word-embedding-init-std", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
            "--loss-scale-window", "--hysteresis", "--distributed-timeout-minutes")
NON_NEGATIVE = ("--lr", "--min-lr", "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-tokens", "--eval-iters",
                "--num-workers", "--valid-num-workers", "--weight-decay", "--clip-grad", "--seed", "--zero-stage",
                "--start-weight-decay", "--end-weight-decay", "--zero-reduce-bucket-size",
                "--zero-allgather-bucket-size")
FRACTIONS = ("--hidden-dropout", "--attention-dropout", "--lr-warmup-fraction", "--sgd-momentum")
BELOW_ONE = ("--adam-beta1", "--adam-beta2")  # torch's Adam refuses 1.0


def _dest(flag):
    return flag.lstrip("-").replace("-", "_")


def validate_flag_values(args: argparse.Namespace) -> None:
    """Each flag's own range, before any flag is combined with another."""
    for rule, flags in ((require_positive, POSITIVE), (require_non_negative, NON_NEGATIVE),
                        (require_fraction, FRACTIONS)):
        for flag in flags:
            if hasattr(args, _dest(flag)):
                rule(flag, getattr(args, _dest(flag)))
    for flag in BELOW_ONE:
        if hasattr(args, _dest(flag)):
            require_fraction(flag, getattr(args, _dest(flag)), below_one=True)
    if getattr(args, "seed", None) is not None:
        _require(args.seed < 2 ** 32, f"--seed {args.seed} must be below 2^32 (numpy's seed range)")
    if getattr(args, "zero_stage", None) is not None:
        _require(args.zero_stage <= 3, f"--zero-stage {args.zero_stage} does not exist: use 0, 1, 2 or 3")
    if getattr(args, "initial_loss_scale", None) is not None:
        power = float(args.initial_loss_scale).as_integer_ratio()
        _require(args.initial_loss_scale >= 1 and power[1] == 1 and power[0] & (power[0] - 1) == 0,
                 f"--initial-loss-scale {args.initial_loss_scale} must be a power of 2 (DeepSpeed takes its exponent)")
    if getattr(args, "lr", None) is not None and getattr(args, "min_lr", None) is not None:
        _require(args.min_lr <= args.lr, f"--min-lr {args.min_lr} exceeds --lr {args.lr}: the decay would rise")


def _validate_ulysses(args: argparse.Namespace, world_size: int) -> int:
    """DeepSpeed-Ulysses (--ds-sequence-parallel-size): the layouts it runs in, in one line each.
    Returns the SP size."""
    sp = args.ds_sequence_parallel_size
    _require(sp >= 1, f"--ds-sequence-parallel-size {sp} must be at least 1 (1: no sequence parallelism)")
    if sp == 1:
        return sp
    flag = f"--ds-sequence-parallel-size {sp}"
    shape = args.model_shape
    # DeepSpeed's pipeline engine averages gradients over its own DP group only (not the SP ranks)
    _require(args.no_pipeline_parallel and args.pipeline_model_parallel_size == 1
             and args.tensor_model_parallel_size == 1,
             f"{flag} runs with --no-pipeline-parallel and TP = PP = 1 (got TP {args.tensor_model_parallel_size}, "
             f"PP {args.pipeline_model_parallel_size}{'' if args.no_pipeline_parallel else ', pipeline engine'}): "
             f"add --no-pipeline-parallel and use --tensor/--pipeline-model-parallel-size 1")
    _require(not shape.is_moe, f"{flag} runs dense models only: drop --num-experts or the SP size")
    _require(world_size % sp == 0,
             f"world size {world_size} is not divisible by {flag}: launch a multiple of {sp} ranks")
    _require(args.seq_length % sp == 0 and shape.num_attention_heads % sp == 0
             and shape.num_key_value_heads % sp == 0,
             f"{flag} must divide --seq-length ({args.seq_length}), --num-attention-heads "
             f"({shape.num_attention_heads}) and the key/value heads ({shape.num_key_value_heads}): "
             f"each rank holds s/SP tokens, then all of them for heads/SP heads")
    return sp


def validate_rampup(args: argparse.Namespace, data_parallel_size: int | None = None) -> list[int]:
    """--rampup-batch-size <start> <increment> <ramp-up samples> against the batch sizes (and, given
    the DP size, micro batch x DP); returns the three integers (also shared with tools/param_count.py)."""
    _require(len(args.rampup_batch_size) == 3,
             "--rampup-batch-size takes 3 values: <start batch> <increment> <ramp-up samples>")
    start, incr, samples = (_int(v, "--rampup-batch-size") for v in args.rampup_batch_size)
    _require(start > 0 and incr > 0 and samples > 0,
             f"--rampup-batch-size {start} {incr} {samples}: start batch, increment and ramp-up samples must be > 0")
    gbs = args.global_batch_size
    if gbs is not None:
        _require(start <= gbs, f"--rampup-batch-size: start batch {start} exceeds --global-batch-size {gbs}; "
                               f"a ramp-up grows the batch: start at or below it")
        _require((gbs - start) % incr == 0,
                 f"--rampup-batch-size: global batch {gbs} minus start batch {start} is not divisible by "
                 f"the increment {incr}")
    if data_parallel_size is not None:
        mbs = args.micro_batch_size
        for what, value in (("start batch", start), ("increment", incr)):
            _require(value % (mbs * data_parallel_size) == 0,
                     f"--rampup-batch-size: {what} {value} is not divisible by --micro-batch-size {mbs} x "
                     f"data-parallel size {data_parallel_size}")
    return [start, incr, samples]


def validate_args(args: argparse.Namespace, world_size: int | None = None,
                  cuda_available: bool | None = None) -> RunArgs:
    """Check every flag against the others; fill in derived values. Cheap: no distributed
    init, no model, no data. Raises ConfigError with a one-line message."""
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if cuda_available is None:
        import torch
        cuda_available = torch.cuda.is_available()
    args.world_size = world_size

    _require(args.micro_batch_size is not None, "--micro-batch-size is required")
    _require(args.lr is not None, "--lr is required (e.g. --lr 1e-4)")
    validate_flag_values(args)
    from megatron.config.fork_features import check_logging_flags, refuse_and_map
    refuse_and_map(args)  # refused fork features; --recompute-* onto --checkpoint-activations
    # the shape's defaults and rules live in ModelShape (TP and PP sizes included); the vocab is
    # --vocab-size here (so it is checked now) and the tokenizer's once that is built
    args.model_shape = ModelShape.from_args(args, vocab_size=args.vocab_size)
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    _require(world_size % (tp * pp) == 0,
             f"world size {world_size} is not divisible by --tensor-model-parallel-size {tp} x "
             f"--pipeline-model-parallel-size {pp}: launch a multiple of {tp * pp} ranks or change TP/PP")
    sp = _validate_ulysses(args, world_size)
    # a replica is TP x PP x SP ranks; the SP ranks of one replica read the same samples
    args.data_parallel_size = world_size // (tp * pp * sp)
    # from here on args.ffn_hidden_size, .kv_channels, .padded_vocab_size, ... read the shape
    as_run_args(args)
    _require(not (args.no_pipeline_parallel and pp > 1),
             f"--no-pipeline-parallel needs --pipeline-model-parallel-size 1 (got {pp}); drop one of them")
    if args.optimizer == "adamw":
        # Megatron's adam already is AdamW (decoupled weight decay: torch.optim.AdamW, apex FusedAdam
        # adam_w_mode=True); Argonne's fork spells the same optimizer adamw
        args.optimizer = "adam"
    _require(args.optimizer in ("adam", "sgd"),
             f"--optimizer {args.optimizer} is not supported: use adam or sgd (adamw is adam)")
    _require(not (args.distributed_backend == "nccl" and not cuda_available),
             "--distributed-backend nccl needs CUDA devices and none is visible: drop the flag (gloo is the "
             "default without CUDA) or pass --distributed-backend gloo")
    _require(args.peak_tflops is None or args.peak_tflops > 0,
             f"--peak-tflops {args.peak_tflops} must be positive: the dense peak TFLOP/s of one device")

    _validate_moe(args)
    _validate_torch_compile(args)
    _validate_sequence_parallel(args)
    _validate_batch_sizes(args)
    _validate_training_length(args)
    if args.skip_train_iteration_range:
        from megatron.schedules.skip_iterations import parse_ranges
        args.skip_train_iteration_range = parse_ranges(args.skip_train_iteration_range)
    _validate_precision(args, cuda_available)
    _validate_weight_decay(args)
    _require(not ((args.reset_position_ids or args.reset_attention_mask) and args.ds_sequence_parallel_size > 1),
             "--reset-position-ids / --reset-attention-mask do not run with --ds-sequence-parallel-size > 1 "
             "(each Ulysses rank holds a chunk of the documents): drop them or the Ulysses size")
    _require(not (args.log_memory_to_tensorboard and not cuda_available),
             "--log-memory-to-tensorboard logs torch.cuda.memory_stats() and no CUDA device is visible: drop the flag")
    _validate_data(args)
    _resolve_activation_checkpointing(args)
    # deepspeed.checkpointing (and its --partition-activations) acts on checkpointed activations only
    args.deepspeed_activation_checkpointing = args.deepspeed_activation_checkpointing and args.checkpoint_activations
    _require(not (args.deepspeed_activation_checkpointing and args.contigious_checkpointing
                  and not args.partition_activations),
             "--contigious-checkpointing needs --partition-activations (DeepSpeed copies partitioned activations "
             "into one buffer): add it or drop --contigious-checkpointing")
    args.ds_pipeline_enabled = not args.no_pipeline_parallel
    args.deepspeed = True  # this trainer always runs through the DeepSpeed engine
    _apply_deepspeed_config(args)
    _require(args.ds_sequence_parallel_size == 1 or args.zero_stage < 3,
             f"--ds-sequence-parallel-size {args.ds_sequence_parallel_size} runs with ZeRO stage 0, 1 or 2 "
             f"(got {args.zero_stage}): lower --zero-stage / zero_optimization.stage")
    check_logging_flags(args, fp32_zero0=not (args.fp16 or args.bf16) and args.zero_stage == 0)
    return cast(RunArgs, args)  # as_run_args above made it one


def _resolve_activation_checkpointing(args):
    """One description of what is recomputed: --checkpoint-activations [--checkpoint-num-layers N] is
    the uniform method; --activations-checkpoint-method alone turns checkpointing on (as in the forks).
    Afterwards args.activations_checkpoint_method is None, 'uniform' or 'block' and
    args.checkpoint_num_layers is its N (shared with tools/param_count.py)."""
    method, n = args.activations_checkpoint_method, args.activations_checkpoint_num_layers
    if n is not None:
        _require(method is not None, "--activations-checkpoint-num-layers needs --activations-checkpoint-method "
                                     "uniform or block (or use --checkpoint-activations --checkpoint-num-layers)")
        _require(args.checkpoint_num_layers in (1, n),
                 f"--activations-checkpoint-num-layers {n} contradicts --checkpoint-num-layers "
                 f"{args.checkpoint_num_layers}: give one of them")
        args.checkpoint_num_layers = n
    if method is not None:
        args.checkpoint_activations = True
    elif args.checkpoint_activations:
        args.activations_checkpoint_method = "uniform"


def _validate_sequence_parallel(args):
    """--sequence-parallel: off at TP 1 as in Megatron-LM (a startup note says so); at TP > 1 every
    rank holds s/TP positions of the sequence."""
    if not args.sequence_parallel:
        return
    tp = args.tensor_model_parallel_size
    if tp == 1:
        args.sequence_parallel = False
        args.startup_notes = getattr(args, "startup_notes", []) + [
            "--sequence-parallel is off at --tensor-model-parallel-size 1: no TP ranks to shard the sequence over "
            "(as in Megatron-LM)"]
        return
    _require(args.seq_length % tp == 0,
             f"--sequence-parallel: --seq-length {args.seq_length} is not divisible by --tensor-model-parallel-size "
             f"{tp}: each TP rank holds seq-length / TP positions; use a multiple of {tp} or drop --sequence-parallel")
    _require(not args.model_shape.is_moe,
             "--sequence-parallel with MoE layers (--num-experts) is not supported: the experts take whole "
             "sequences; drop --sequence-parallel")


def _validate_torch_compile(args):
    """--torch-compile runs the dense layers; DeepSpeed's MoE gating and Ulysses' all-to-all are
    untested under TorchDynamo, so those combinations are refused rather than guessed."""
    if not args.torch_compile:
        return
    _require(not args.model_shape.is_moe,
             "--torch-compile compiles dense transformer layers only: drop it or --num-experts")
    _require(args.ds_sequence_parallel_size == 1,
             f"--torch-compile does not run with --ds-sequence-parallel-size {args.ds_sequence_parallel_size} "
             f"(DeepSpeed-Ulysses): drop one of them")


def _validate_moe(args):
    """What the shape cannot know: the DP size, the tokens per micro-batch."""
    shape = args.model_shape
    if not shape.is_moe:
        return
    ep, dp = shape.moe_expert_parallel_size, args.data_parallel_size
    _require(dp % ep == 0, f"--moe-expert-parallel-size {ep} does not divide the data-parallel size {dp}: "
                           f"launch a multiple of {ep} x TP x PP ranks or lower EP")
    tp = args.tensor_model_parallel_size
    if tp > 1 and args.moe_token_dropping:
        # DeepSpeed splits each expert's capacity over the TP ranks
        tokens = args.micro_batch_size * args.seq_length
        for flag, factor in (("--moe-train-capacity-factor", args.moe_train_capacity_factor),
                             ("--moe-eval-capacity-factor", args.moe_eval_capacity_factor)):
            for e in set(shape.experts_per_layer()) - {1}:
                capacity = max(math.ceil(tokens / e * factor * shape.topk), args.moe_min_capacity)
                _require(capacity % tp == 0,
                         f"{flag} {factor}: expert capacity {capacity} ({tokens} tokens, {e} experts, top-"
                         f"{shape.topk}) is not divisible by --tensor-model-parallel-size {tp}; change it or "
                         f"--moe-min-capacity, or pass --disable-moe-token-dropping")


def _validate_batch_sizes(args):
    dp, mbs = args.data_parallel_size, args.micro_batch_size
    if args.global_batch_size is None:
        args.global_batch_size = mbs * dp
    gbs = args.global_batch_size
    _require(gbs % (mbs * dp) == 0,
             f"--global-batch-size {gbs} is not divisible by --micro-batch-size {mbs} x data-parallel "
             f"size {dp}: use a multiple of {mbs * dp}")
    if args.rampup_batch_size:
        start, incr, samples = validate_rampup(args, dp)
        _require(args.train_samples is not None,
                 "--rampup-batch-size needs --train-samples (sample-based training)")
        args.rampup_batch_size = [start, incr, samples]


def _validate_training_length(args):
    _require((args.train_iters is None) != (args.train_samples is None),
             "give exactly one of --train-iters or --train-samples")
    if args.train_iters is not None:
        _require(args.lr_warmup_samples == 0 and args.lr_decay_samples is None,
                 "--train-iters goes with --lr-warmup-iters / --lr-decay-iters, not the -samples variants")
    else:
        _require(args.lr_warmup_iters == 0 and args.lr_decay_iters is None,
                 "--train-samples goes with --lr-warmup-samples / --lr-decay-samples, not the -iters variants")
    _require(args.lr_warmup_fraction is None or (args.lr_warmup_iters == 0 and args.lr_warmup_samples == 0),
             "give either --lr-warmup-fraction or --lr-warmup-iters/-samples, not both")
    _require(args.lr_warmup_tokens is None or (args.lr_warmup_fraction is None and args.lr_warmup_iters == 0
                                                and args.lr_warmup_samples == 0),
             "--lr-warmup-tokens replaces --lr-warmup-iters/-samples/-fraction: give only one warmup")
    _require(not (args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler),
             "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are exclusive: pick one")
    from megatron.schedules.learning_rates import schedule_lengths
    (warmup, decay), (warmup_tokens, decay_tokens) = schedule_lengths(args)
    if warmup_tokens is not None or decay_tokens is not None:
        seq = args.seq_length
        warmup_tokens = warmup * seq if warmup_tokens is None else warmup_tokens
        decay_tokens = decay * seq if decay_tokens is None else decay_tokens
        _require(warmup_tokens < decay_tokens,
                 f"the warmup ({warmup_tokens} tokens) must end before the decay ({decay_tokens} tokens) does: "
                 f"lower --lr-warmup-tokens or raise --lr-decay-tokens")
    _validate_wsd(args, warmup, decay, warmup_tokens, decay_tokens)
    _validate_wandb(args)
    _require(not args.log_progress or args.save,
             "--log-progress writes progress.txt into the --save directory: add --save DIR or drop it")


def _validate_wandb(args):
    """--wandb-project: a run name, a local directory, and the optional `wandb` package."""
    if not args.wandb_project:
        return
    _require(args.wandb_exp_name, f"--wandb-project {args.wandb_project} needs --wandb-exp-name NAME (the run's name)")
    _require(args.wandb_save_dir or args.save,
             "--wandb-project writes its files into --wandb-save-dir (default --save/wandb): give one of them")
    import importlib.util
    _require(importlib.util.find_spec("wandb") is not None,
             "--wandb-project needs the wandb package: pip install -e '.[wandb]' (or drop --wandb-project)")


def _validate_wsd(args, warmup, decay, warmup_tokens, decay_tokens):
    """WSD needs its cool-down length in the unit the run counts in (Megatron-LM's rule), and the
    cool-down must fit between the warmup's end and the decay length's."""
    from megatron.schedules.learning_rates import wsd_decay_lengths
    given = [f for f in ("--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--lr-wsd-decay-tokens")
             if getattr(args, _dest(f)) is not None]
    if args.lr_decay_style != "WSD":
        _require(not given, f"{given[0] if given else ''} is WSD's cool-down: add --lr-decay-style WSD or drop it")
        return
    unit = "--lr-wsd-decay-iters" if args.train_iters is not None else "--lr-wsd-decay-samples"
    other = "--lr-wsd-decay-samples" if args.train_iters is not None else "--lr-wsd-decay-iters"
    _require(other not in given, f"{other} does not go with --train-{'iters' if args.train_iters else 'samples'}: "
                                 f"give the WSD cool-down with {unit} (or --lr-wsd-decay-tokens)")
    samples, tokens = wsd_decay_lengths(args)
    _require(samples is not None or tokens is not None,
             f"--lr-decay-style WSD needs its cool-down length: {unit} (or --lr-wsd-decay-tokens)")
    if tokens is not None or warmup_tokens is not None or decay_tokens is not None:  # token mode
        seq = args.seq_length
        length, room, what = (tokens if tokens is not None else samples * seq,
                              (decay_tokens if decay_tokens is not None else decay * seq)
                              - (warmup_tokens if warmup_tokens is not None else warmup * seq), "tokens")
    else:
        length, room, what = samples, decay - warmup, "samples"
    _require(length <= room, f"the WSD cool-down ({length} {what}) is longer than the decay after the warmup "
                             f"({room} {what}): shorten {unit} or lengthen the decay")


def _validate_precision(args, cuda_available):
    _require(not (args.fp16 and args.bf16), "--fp16 and --bf16 are exclusive: pick one")
    _require(not args.fp16 or cuda_available,
             "--fp16 needs a CUDA device: on CPU train in fp32 (drop --fp16) or use --bf16")
    _require(not args.fp32_residual_connection or args.fp16 or args.bf16,
             "--fp32-residual-connection needs --fp16 or --bf16: in fp32 the residual stream is fp32 already; "
             "drop the flag")
    given = set(getattr(args, "given_flags", ()))
    _require(not {"--apply-query-key-layer-scaling", "--no-query-key-layer-scaling"} <= given,
             "--apply-query-key-layer-scaling contradicts --no-query-key-layer-scaling: drop one")
    import torch
    args.params_dtype = torch.half if args.fp16 else (torch.bfloat16 if args.bf16 else torch.float32)


def _validate_weight_decay(args):
    """Megatron's rules: the constant style is --weight-decay throughout (the start / end flags are
    for the other styles), linear and cosine need both ends, and decay only grows."""
    style = args.weight_decay_incr_style
    if style == "constant":
        _require(args.start_weight_decay is None and args.end_weight_decay is None,
                 "--start-weight-decay / --end-weight-decay need --weight-decay-incr-style linear or cosine "
                 "(constant uses --weight-decay)")
        args.start_weight_decay = args.end_weight_decay = args.weight_decay
        return
    _require(args.start_weight_decay is not None and args.end_weight_decay is not None,
             f"--weight-decay-incr-style {style} needs --start-weight-decay and --end-weight-decay")
    _require(args.end_weight_decay >= args.start_weight_decay,
             f"--end-weight-decay {args.end_weight_decay} is below --start-weight-decay {args.start_weight_decay}: "
             f"weight decay only increases in Megatron's schedule")


SPLIT_PATH_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")


def _validate_split_data_paths(args):
    """Megatron-LM's rule: one source of data, --data-path (split by --split) or a path per split
    (each read whole); Microsoft's fork would silently ignore the per-split paths."""
    given = [flag for flag in SPLIT_PATH_FLAGS if getattr(args, _dest(flag))]
    if not given:
        return False
    _require(not (args.data_path or args.mock_data or args.weighted_split_groups),
             f"{', '.join(given)} and --data-path / --data-file-list / --mock-data / --*-weighted-split-paths are "
             f"two ways to give the data: use one")
    _require(args.train_data_path, "--valid-data-path / --test-data-path need --train-data-path (the data trained on)")
    _require(args.split is None, f"--split cuts --data-path into the splits; {', '.join(given)} are read whole "
                                 f"(Megatron-LM: split and blend_per_split are incompatible): drop --split")
    for flag in given:
        from megatron.data.gpt_dataset import get_datasets_weights_and_num_samples
        prefixes = getattr(args, _dest(flag))
        if len(prefixes) > 1:
            try:
                get_datasets_weights_and_num_samples(prefixes, [1, 1, 1])
            except ValueError as e:
                raise ConfigError(str(e).replace("--data-path", flag)) from None
    return True


def _validate_data(args):
    for flag, path in (("--vocab-file", args.vocab_file), ("--merge-file", args.merge_file)):
        _require(path is None or os.path.isfile(path), f"{flag} {path}: no such file")
    for flag in ("--tokenizer-name-or-path", "--tokenizer-model"):
        _require(args.tokenizer_type is not None or getattr(args, _dest(flag)) is None,
                 f"{flag} needs --tokenizer-type (PretrainedFromHF for --tokenizer-name-or-path; "
                 f"GPTSentencePieceTokenizer or HFTokenizer for --tokenizer-model)")
    if args.tokenizer_type in PATH_FLAG:  # a local tokenizer file or directory (never a hub name)
        try:
            tokenizer_path(args, args.tokenizer_type)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    _require(args.data_cache_path is None or not os.path.isfile(args.data_cache_path),
             f"--data-cache-path {args.data_cache_path} is a file: give a directory (it is created if missing)")
    if args.data_file_list is not None:  # Argonne's file of weight / prefix / corpus lines: --data-path's blend
        _require(not args.data_path and not args.mock_data,
                 "--data-file-list and --data-path / --mock-data are two ways to give the data: use one")
        from megatron.data.data_file_list import read_data_file_list
        args.data_path = read_data_file_list(args.data_file_list)
    from megatron.data.weighted_split_paths import groups_from_args
    args.weighted_split_groups = groups_from_args(args)
    if args.weighted_split_groups:
        _require(not args.data_path and args.split is None and not args.mock_data,
                 "--data-path / --split / --mock-data and --(train|valid|test)-weighted-split-paths are two ways "
                 "to give the data: use one")
        if args.tokenizer_type in (None, "GPT2BPETokenizer"):
            _require(args.vocab_file and args.merge_file,
                     "--vocab-file and --merge-file are required for the GPT-2 BPE tokenizer")
        return
    if _validate_split_data_paths(args):
        if args.tokenizer_type in (None, "GPT2BPETokenizer"):
            _require(args.vocab_file and args.merge_file,
                     "--vocab-file and --merge-file are required for the GPT-2 BPE tokenizer")
        return
    if args.split is None:
        args.split = "969, 30, 1"
    if args.mock_data and args.tokenizer_type in PATH_FLAG:  # the vocab comes from the tokenizer
        return
    if args.mock_data:
        _require(args.vocab_size is not None or (args.vocab_file and args.merge_file),
                 "--mock-data needs --vocab-size N (or --vocab-file and --merge-file)")
        return
    _require(args.data_path, "--data-path is required (or pass --mock-data for a synthetic token stream)")
    from megatron.data.gpt_dataset import get_train_valid_test_split_
    try:
        get_train_valid_test_split_(args.split, 1000)  # the format only; the data's size is not known yet
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.tokenizer_type in (None, "GPT2BPETokenizer"):
        _require(args.vocab_file and args.merge_file,
                 "--vocab-file and --merge-file are required for the GPT-2 BPE tokenizer")
    # weight/prefix pairs or a single prefix; the files must exist before anything is launched
    prefixes = args.data_path[1::2] if len(args.data_path) > 1 else args.data_path
    for prefix in prefixes:
        for suffix in (".bin", ".idx"):
            _require(os.path.isfile(prefix + suffix),
                     f"--data-path {prefix}: {prefix + suffix} does not exist; create it with "
                     f"tools/preprocess_data.py --output-prefix ... (the prefix ends in _text_document)")
