"""The rest of the forks' published GPT-script flags: Megatron-LM's activation-recompute spellings
(mapped onto --activations-checkpoint-method, the same meaning), the logging flags
--log-params-norm / --log-num-zeros-in-grad (megatron/metrics/grad_stats.py), and every other flag of
megatron/config/flag_table.py the parser does not declare elsewhere: the features this trainer does not
have and other models' flags, each refused with one line before anything is built (a script passing
them expects a training this trainer would not do), and the no-effect ones."""
import argparse

from megatron.config import flag_table
from megatron.runtime.refusal import ConfigError
from megatron.runtime.refusal import require as _require

# flag -> its row: features this trainer does not have, and other models' flags (megatron/config/flag_table.py)
REFUSED = {**flag_table.by_status(flag_table.REFUSED), **flag_table.by_status(flag_table.OTHER_MODEL)}


def add_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("fork features (megatron/config/fork_features.py)")
    g.add_argument("--recompute-granularity", choices=["full", "selective"], default=None,
                   help="full = --activations-checkpoint-method (--recompute-method); selective: no effect")
    g.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    g.add_argument("--recompute-num-layers", type=int, default=1, help="= --activations-checkpoint-num-layers")
    g.add_argument("--recompute-activations", action="store_true", help="= --recompute-granularity selective")
    g.add_argument("--log-params-norm", action="store_true", help="L2 norm of the parameters in the log line")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="number of zero entries of the gradient in the log line")
    g.add_argument("--timing-log-level", type=int, default=0, choices=range(0, 3), help="accepted; no effect")
    g.add_argument("--no-load-lr-state", action="store_true", help="accepted; no effect (as in the fork)")
    g.add_argument("--dataloader-type", choices=["single", "cyclic"], default=None,
                   help="single (the default) only")
    g.add_argument("--no-data-sharding", action="store_false", dest="data_sharding", help="accepted; no effect")
    g.add_argument("--transformer-impl", choices=["local", "transformer_engine"], default="local",
                   help="local only")
    # every other flag of the table not declared yet (refused, other models', accepted with no effect)
    for row in flag_table.rows():
        if row.status != flag_table.IMPLEMENTED and row.flag not in parser._option_string_actions:
            g.add_argument(row.flag, help=row.status, **flag_table.argparse_keywords(row))


def _dest(flag):
    return flag.lstrip("-").replace("-", "_")


def refuse_and_map(args: argparse.Namespace) -> None:
    """The refusals (one line, the first refused flag given), then the recompute spellings. Runs in
    validate_args, before anything is built."""
    # the first refused flag as the user gave it (then the table's order, for args built without argv)
    for flag in dict.fromkeys([*getattr(args, "given_flags", ()), *REFUSED]):
        value = getattr(args, _dest(flag), None) if flag in REFUSED else None
        if value is not None and value is not False:
            raise ConfigError(flag_table.refusal(REFUSED[flag]))
    _require(args.word_embedding_init_std is None or args.adjust_word_embedding_init,
             f"--word-embedding-init-std {args.word_embedding_init_std} acts with --adjust-word-embedding-init only "
             f"(Argonne's fork ignores it otherwise): add --adjust-word-embedding-init or drop the flag")
    _require(args.transformer_impl == "local",
             "--transformer-impl transformer_engine: Transformer Engine is not supported by this trainer; "
             "use local (the default)")
    _require(args.dataloader_type in (None, "single"),
             "--dataloader-type cyclic: the multi-epoch random sampler is not supported by this trainer; "
             "use single (the default for GPT in both forks)")
    map_recompute(args)


def map_recompute(args: argparse.Namespace) -> None:
    """Microsoft's fork: --recompute-granularity full --recompute-method {uniform,block}
    --recompute-num-layers N recomputes what --activations-checkpoint-method / -num-layers N do here
    (both forks' older spelling; megatron/config/arguments.py resolves it): uniform, chunks of N layers;
    block, the first N layers of each stage (the fork's pipeline model ignores block and recomputes
    nothing: the same math, other memory). --checkpoint-activations, when also given, wins with
    its own --checkpoint-num-layers, as in the fork. Also run by tools/param_count.py, so its FLOPs
    (recompute) and memory table follow."""
    _require(args.recompute_num_layers > 0, f"--recompute-num-layers {args.recompute_num_layers} must be > 0")
    if args.recompute_activations:
        args.recompute_granularity = "selective"
    if args.recompute_granularity == "selective":
        _require(args.recompute_method is None,
                 "--recompute-method goes with --recompute-granularity full, not selective: drop one of them")
    if args.recompute_granularity != "full":
        return
    _require(args.recompute_method is not None,
             "--recompute-granularity full needs --recompute-method uniform or block (the fork's model refuses "
             "it without one too)")
    _require(args.activations_checkpoint_method is None,
             "--recompute-granularity full and --activations-checkpoint-method are two spellings of one thing: "
             "give one of them")
    if not args.checkpoint_activations:
        args.activations_checkpoint_method = args.recompute_method
        args.activations_checkpoint_num_layers = args.recompute_num_layers


def check_logging_flags(args: argparse.Namespace, fp32_zero0: bool) -> None:
    """After the ds_config is known: the gradient's zeros are counted where the optimizer sees the
    model's own gradients (fp32 without ZeRO); the parameter norm needs whole parameters."""
    _require(not args.log_num_zeros_in_grad or fp32_zero0,
             "--log-num-zeros-in-grad is supported for fp32 runs without ZeRO only (DeepSpeed's fp16 / bf16 / "
             "ZeRO optimizers hold the gradient in flat partitions): drop the flag")
    _require(not (args.log_params_norm and args.zero_stage == 3),
             "--log-params-norm does not work with ZeRO stage 3 (its parameters are partitioned): use "
             "--zero-stage 0, 1 or 2, or drop the flag")

