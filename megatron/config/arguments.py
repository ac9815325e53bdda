"""Megatron-DeepSpeed command line: the same flags and meanings, so existing launch scripts run
unchanged. This module declares the flags and parses them; megatron/config/validation.py checks
them (all validation in one place, run on every rank before any heavy work)."""
import argparse
import sys
from collections.abc import Callable

from megatron.model.shape import GLU_ACTIVATIONS, POSITION_EMBEDDING_ALIASES
from megatron.runtime.refusal import ConfigError
from megatron.tokenizer.tokenizer import TOKENIZER_TYPES


def parse_args(extra_args_provider: Callable | None = None, args_list: list[str] | None = None) -> argparse.Namespace:
    from megatron.config.script_flags import given_flags
    parser = build_parser(extra_args_provider)
    args, unknown = parser.parse_known_args(args_list)
    if unknown:  # all of them in one line (argparse's own error names them after its whole usage)
        raise ConfigError(unknown_flags_message(unknown))
    # which flags the user really passed (a default cannot tell): the startup line names those
    # accepted with no effect, and --clip-grad is reported when DeepSpeed's clipping overrides it
    args.given_flags = given_flags(parser, sys.argv[1:] if args_list is None else args_list)
    return args


class MegatronArgumentParser(argparse.ArgumentParser):
    """An argparse error (a bad value, a missing one) is a ConfigError: one line, printed once per job
    by pretrain_gpt.py, instead of argparse's ~150-line usage on every rank. --help prints as before."""

    def error(self, message: str):
        raise ConfigError(message)


def flag_names(tokens: list[str]) -> list[str]:
    """The flags among argparse's leftover tokens, as spelled (`--flag=value`: `--flag`), without
    the values that followed them."""
    return list(dict.fromkeys(tok.split("=", 1)[0] for tok in tokens if tok.startswith("-") and not _is_number(tok)))


def unknown_flags_message(unknown: list[str]) -> str:
    """One line naming every flag argparse did not know (their values left out)."""
    named = ", ".join(flag_names(unknown)) or " ".join(unknown)
    return (f"unrecognized arguments: {named} (not flags of this trainer: check the spelling, or drop them; "
            f"pretrain_gpt.py --help lists the flags it takes)")


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def build_parser(extra_args_provider: Callable | None = None) -> argparse.ArgumentParser:
    parser = add_megatron_args(MegatronArgumentParser(description="Megatron-DeepSpeed GPT arguments",
                                                      allow_abbrev=False))
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    import deepspeed  # adds --deepspeed, --deepspeed_config (and its aliases)
    return deepspeed.add_config_arguments(parser)


def add_megatron_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag of the trainer but DeepSpeed's own (tools/param_count.py: without importing torch)."""
    for add in (_add_network_size_args, _add_regularization_args, _add_training_args,
                _add_initialization_args, _add_learning_rate_args, _add_checkpointing_args,
                _add_mixed_precision_args, _add_distributed_args, _add_validation_args,
                _add_data_args, _add_logging_args, _add_activation_checkpoint_args,
                _add_zero_args, _add_moe_args, _add_published_script_args, _add_fork_feature_args):
        add(parser)
    return parser


def _add_network_size_args(parser):
    g = parser.add_argument_group("network size")
    g.add_argument("--num-layers", type=int, default=None)
    g.add_argument("--hidden-size", type=int, default=None)
    g.add_argument("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden size")
    g.add_argument("--num-attention-heads", type=int, default=None)
    g.add_argument("--max-position-embeddings", type=int, default=None)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the vocab to a multiple of this x TP size")
    g.add_argument("--pad-vocab-size-to", type=int, default=None,
                   help="BigScience: pad the vocab to exactly N (>= the tokenizer's size, a multiple of "
                        "--make-vocab-size-divisible-by and of TP)")
    g.add_argument("--layernorm-epsilon", "--norm-epsilon", type=float, default=1e-5, help="LayerNorm and RMSNorm")
    g.add_argument("--attention-impl", choices=["sdpa", "math"], default="sdpa",
                   help="sdpa: torch.nn.functional.scaled_dot_product_attention; math: explicit matmuls")
    # Megatron's kernel-fusion switches: this code base runs unfused ops unless --torch-compile, so
    # "no fusion" is its default anyway; accepted so existing launch scripts run unchanged.
    for flag in ("--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
                 "--no-gradient-accumulation-fusion"):
        g.add_argument(flag, action="store_true", help="accepted; unfused is the default (--torch-compile fuses)")
    # opt-in while compiling costs start-up time (megatron/model/compiled.py)
    g.add_argument("--torch-compile", action="store_true",
                   help="torch.compile each transformer layer (inductor): fuses its elementwise chains (bias + "
                        "GeLU, dropout + residual, norms); compiles at the first iterations")
    _add_architecture_variant_args(parser)


def _add_architecture_variant_args(parser):
    """Both forks' spellings (BigScience's and Microsoft's Megatron-DeepSpeed, a few of
    Megatron-LM's); ModelShape.from_args resolves them, applies the defaults and validates."""
    g = parser.add_argument_group("architecture variants")
    g.add_argument("--position-embedding-type", default=None,
                   choices=["absolute", "rotary", "alibi"] + list(POSITION_EMBEDDING_ALIASES),
                   help="default absolute (a learned table); learned_absolute and rope are aliases")
    g.add_argument("--use-rotary-position-embeddings", action="store_true", help="= --position-embedding-type rotary")
    g.add_argument("--no-position-embedding", action="store_false", dest="add_position_embedding",
                   help="no learned position table")
    g.add_argument("--rotary-position-embeddings-theta", "--rotary-base", type=float, default=10000.0,
                   dest="rope_theta")
    g.add_argument("--rotary-percent", type=float, default=1.0,
                   help="Microsoft: rotary on the first int(head dim x p) channels of each head (default all)")
    g.add_argument("--glu-activation", default=None, choices=list(GLU_ACTIVATIONS),
                   help="GLU MLP: dense_h_to_4h yields 2 x ffn outputs (ffn default stays 4h)")
    g.add_argument("--swiglu", action="store_true", help="= --glu-activation swiglu, ffn default int(8h/3/64)*64")
    g.add_argument("--normalization", default="layernorm", help="layernorm or rmsnorm")
    g.add_argument("--embed-layernorm", action="store_true", help="a LayerNorm after the word embedding")
    g.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear",
                   help="no bias in the QKV, dense and MLP linears")
    g.add_argument("--add-qkv-bias", action="store_true",
                   help="Megatron-LM: a bias in the QKV projection only (with --disable-bias-linear; Qwen2)")
    g.add_argument("--num-key-value-heads", type=int, default=None, help="grouped-query attention; default: heads")
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=None, help="with --group-query-attention; default 1")
    g.add_argument("--kv-channels", type=int, default=None, help="head dim; default hidden size / heads")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g.add_argument("--apply-residual-connection-post-layernorm", action="store_true",
                   help="the residuals add the norms' outputs, not their inputs (original BERT ordering)")
    g.add_argument("--apply-layernorm-1p", action="store_true",
                   help="the norms' weights store gamma - 1 (initialised to 0; Megatron's zero-centered gamma)")
    g.add_argument("--openai-gelu", action="store_true", help="GeLU's tanh approximation (GPT-2's)")
    g.add_argument("--squared-relu", action="store_true", help="relu(x)^2 as the MLP activation")


def _add_regularization_args(parser):
    g = parser.add_argument_group("regularization")
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--weight-decay", type=float, default=0.01)
    # Megatron's weight-decay increment over the run (OptimizerParamScheduler.get_wd); constant:
    # --weight-decay throughout, the other styles need both ends
    g.add_argument("--start-weight-decay", type=float, default=None,
                   help="weight decay at the start of the run (linear / cosine --weight-decay-incr-style)")
    g.add_argument("--end-weight-decay", type=float, default=None,
                   help="weight decay at the end of the run (linear / cosine --weight-decay-incr-style)")
    g.add_argument("--weight-decay-incr-style", choices=["constant", "linear", "cosine"], default="constant",
                   help="how weight decay moves from --start-weight-decay to --end-weight-decay over the run")
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--sgd-momentum", type=float, default=0.9)


def _add_training_args(parser):
    g = parser.add_argument_group("training")
    # ours (Megatron-LM has no flag: it always counts causal attention at half its s^2 terms)
    g.add_argument("--flops-attention", choices=["full", "causal"], default="full",
                   help="the FLOPs convention of every FLOPs number (log, TensorBoard, MFU, --log-progress): "
                        "attention's s^2 terms in full (the forks') or halved for the causal mask (Megatron-LM's)")
    g.add_argument("--micro-batch-size", type=int, default=None)
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--rampup-batch-size", nargs="*", default=None,
                   help="<start batch> <increment> <ramp-up samples>, e.g. 2 2 1_000")
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-samples", type=int, default=None)
    g.add_argument("--train-tokens", type=int, default=None,
                   help="also stop once this many tokens (samples x seq length) are consumed (Microsoft's fork)")
    g.add_argument("--exit-interval", type=int, default=None)
    g.add_argument("--exit-duration-in-mins", type=float, default=None)  # Megatron: int; fractions for short runs
    # Megatron-LM's: on --exit-signal (or when the rank's launcher goes away) every rank finishes the
    # iteration, saves and exits 0 (megatron/training/exit_signal.py); with --save, SIGTERM and SIGINT
    # (Ctrl-C) do so without the flag too
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="save a checkpoint and exit when SIGTERM, SIGINT or --exit-signal arrives at any rank or "
                        "the launcher exits (with --save this is on for SIGTERM and SIGINT without the flag)")
    g.add_argument("--exit-signal", choices=["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"], default="SIGTERM",
                   help="a signal --exit-signal-handler acts on besides SIGTERM and SIGINT")
    # Megatron-LM's: on by default; a non-finite loss or gradient norm stops the run without a save
    g.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad",
                   help="train on through a non-finite loss or gradient norm")
    # Megatron-LM's: off by default; a loss 10x the largest of the run's first 100 stops it like a NaN
    g.add_argument("--check-for-spiky-loss", action="store_true",
                   help="stop, as on a NaN, on a loss at least 10 times the largest of the run's first 100")
    g.add_argument("--optimizer", type=str, default="adam")
    g.add_argument("--checkpoint-activations", action="store_true")
    g.add_argument("--checkpoint-num-layers", type=int, default=1)
    # Megatron-LM's / Microsoft's fork's spelling (2021): the method alone turns checkpointing on
    g.add_argument("--activations-checkpoint-method", choices=["uniform", "block"], default=None,
                   help="uniform: checkpoint every chunk of N layers; block: only the first N layers of each "
                        "pipeline stage, one by one (N = --activations-checkpoint-num-layers)")
    g.add_argument("--activations-checkpoint-num-layers", type=int, default=None,
                   help="N of --activations-checkpoint-method (default: --checkpoint-num-layers)")
    g.add_argument("--no-pipeline-parallel", action="store_true",
                   help="plain module + DeepSpeed engine instead of a PipelineModule (needs PP=1)")
    g.add_argument("--pp-partition-method", type=str, default=None,
                   help="pipeline split: DeepSpeed's type:REGEX (default type:transformer, as in the forks), "
                        "uniform or parameters, or flops (balance each stage's forward+backward FLOPs)")


def _add_initialization_args(parser):
    g = parser.add_argument_group("initialization")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--init-method-std", type=float, default=0.02)
    # Argonne's AuroraGPT fork: the word embedding's own std (the fork's default 0.02), with
    # --adjust-word-embedding-init only; without it the word embedding takes --init-method-std
    g.add_argument("--adjust-word-embedding-init", action="store_true",
                   help="Argonne: initialise the word embedding with --word-embedding-init-std")
    g.add_argument("--word-embedding-init-std", type=float, default=None,
                   help="Argonne: the word embedding's init std with --adjust-word-embedding-init (default 0.02)")
    g.add_argument("--init-method-xavier-uniform", action="store_true",
                   help="every weight matrix drawn by torch.nn.init.xavier_uniform_ (instead of normal)")


def _add_learning_rate_args(parser):
    g = parser.add_argument_group("learning rate")
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "WSD"], default="linear")
    # Megatron-LM's WSD: the cool-down's shape and length (the last part of the decay length)
    g.add_argument("--lr-wsd-decay-style", choices=["exponential", "linear", "cosine", "minus_sqrt"],
                   default="exponential", help="WSD: the cool-down's shape")
    g.add_argument("--lr-wsd-decay-iters", type=int, default=None,
                   help="WSD: the cool-down's length in iterations (with --train-iters)")
    g.add_argument("--lr-wsd-decay-samples", type=int, default=None,
                   help="WSD: the cool-down's length in samples (with --train-samples)")
    g.add_argument("--lr-wsd-decay-tokens", type=int, default=None,
                   help="WSD: the cool-down's length in tokens (ours; token mode, as --lr-decay-tokens)")
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--lr-decay-samples", type=int, default=None)
    g.add_argument("--lr-warmup-fraction", type=float, default=None)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-samples", type=int, default=0)
    # Microsoft's fork: a schedule length in tokens overrides the iteration/sample-based one
    g.add_argument("--lr-warmup-tokens", type=int, default=None)
    g.add_argument("--lr-decay-tokens", type=int, default=None)
    # on --load: the flags' schedule, or the checkpoint's; neither: the two must agree (both forks)
    g.add_argument("--override-opt_param-scheduler", "--override-lr-scheduler", action="store_true",
                   dest="override_opt_param_scheduler", help="on resume, the flags' LR schedule wins")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-lr-scheduler", action="store_true",
                   dest="use_checkpoint_opt_param_scheduler", help="on resume, the checkpoint's LR schedule wins")


def _add_checkpointing_args(parser):
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", type=str, default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--no-save-optim", action="store_true")
    g.add_argument("--no-save-rng", action="store_true")
    g.add_argument("--load", type=str, default=None)
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--finetune", action="store_true")
    # BigScience's spelling; Microsoft's and Argonne's --kill-switch-file is the same feature (save, exit)
    g.add_argument("--kill-switch-path", "--kill-switch-file", type=str, default=None, dest="kill_switch_path",
                   help="when this file exists, every rank saves a checkpoint and exits (BigScience's fork)")
    g.add_argument("--exit-on-missing-checkpoint", action="store_true",
                   help="with --load: stop (exit 2) when it holds no checkpoint instead of starting from scratch")
    g.add_argument("--universal-checkpoint", action="store_true",
                   help="--load the output of DeepSpeed's ds_to_universal.py named by DIR/latest_universal")


def _add_mixed_precision_args(parser):
    g = parser.add_argument_group("mixed precision")
    g.add_argument("--fp16", action="store_true")
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="Megatron's fp32 gradient accumulation: the ds_config's data_types.grad_accum_dtype fp32 "
                        "(16-bit weights: with ZeRO)")
    g.add_argument("--fp32-residual-connection", action="store_true",
                   help="the residual stream in fp32 (with --fp16 / --bf16)")
    g.add_argument("--attention-softmax-in-fp32", action="store_true",
                   help="the math attention's softmax in fp32 (already so unless --no-query-key-layer-scaling)")
    # Megatron-DeepSpeed: on by default, and it forces the softmax into fp32; Megatron-LM: off by
    # default, spelled --apply-query-key-layer-scaling
    g.add_argument("--no-query-key-layer-scaling", action="store_false", dest="apply_query_key_layer_scaling",
                   default=True, help="the math attention's softmax in the activations' dtype unless "
                                      "--attention-softmax-in-fp32")
    g.add_argument("--apply-query-key-layer-scaling", action="store_true", dest="apply_query_key_layer_scaling",
                   default=True, help="Megatron-LM's spelling of this trainer's default: the softmax in fp32")
    g.add_argument("--loss-scale", type=float, default=None)
    g.add_argument("--initial-loss-scale", type=float, default=2 ** 32)
    g.add_argument("--min-loss-scale", type=float, default=1.0)
    g.add_argument("--loss-scale-window", type=float, default=1000)
    g.add_argument("--hysteresis", type=int, default=2)


def _add_distributed_args(parser):
    g = parser.add_argument_group("distributed")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism (TP > 1): norms, dropouts and residuals on sequence shards "
                        "of the TP ranks; off at TP 1")
    g.add_argument("--distributed-backend", choices=["nccl", "gloo", "ccl"], default=None,
                   help="default: nccl on CUDA, gloo on CPU")
    g.add_argument("--no-shm-tp-all-reduce", dest="shm_tp_all_reduce", action="store_false",
                   help="CPU: TP all-reduces through gloo even where the shared-memory path applies (TP=2, one host)")
    g.add_argument("--distributed-timeout-minutes", type=int, default=10,
                   help="timeout of torch.distributed's collectives (the process groups'), in minutes")
    g.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the launcher")
    g.add_argument("--DDP-impl", default="local", choices=["local", "torch"],
                   help="accepted; the DeepSpeed engine does data-parallel reduction")


def _add_validation_args(parser):
    g = parser.add_argument_group("validation")
    g.add_argument("--eval-iters", type=int, default=100)
    g.add_argument("--eval-interval", type=int, default=1000)


def _add_data_args(parser):
    g = parser.add_argument_group("data and tokenizer")
    g.add_argument("--data-path", nargs="*", default=None, help="prefix, or weight prefix pairs")
    # Megatron-LM / Microsoft's fork: each split from its own data, whole (no --split)
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="*", default=None,
                       help=f"the {split} split's data: a prefix, or weight prefix pairs (instead of --data-path)")
    g.add_argument("--data-file-list", type=str, default=None,
                   help="Argonne: a file of 'WEIGHT PREFIX CORPUS' lines, blended as --data-path's pairs")
    g.add_argument("--split", type=str, default=None, help='default "969, 30, 1" (with --data-path only)')
    # BigScience's second way (megatron/data/weighted_split_paths.py): named groups per split
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-weighted-split-paths", nargs="*", default=None,
                       help='groups "NAME: WEIGHT START:END PATH, ..."' + (" (one)" if split == "train" else ""))
        g.add_argument(f"--{split}-weighted-split-paths-path", type=str, default=None,
                       help="a file holding the groups on one line, each in double quotes")
    g.add_argument("--vocab-file", type=str, default=None)
    g.add_argument("--merge-file", type=str, default=None)
    g.add_argument("--vocab-size", type=int, default=None, help="with --mock-data")
    g.add_argument("--seq-length", type=int, default=None)
    g.add_argument("--tokenizer-type", type=str, default=None, choices=TOKENIZER_TYPES)
    g.add_argument("--tokenizer-name-or-path", type=str, default=None,
                   help="PretrainedFromHF: a local Hugging Face tokenizer directory (nothing is downloaded)")
    g.add_argument("--tokenizer-model", type=str, default=None,
                   help="GPTSentencePieceTokenizer: the .model file; HFTokenizer: a local tokenizer directory")
    g.add_argument("--trust-remote-code", action="store_true", help="HFTokenizer / PretrainedFromHF: passed to "
                                                                    "transformers.AutoTokenizer")
    g.add_argument("--data-impl", type=str, default="mmap", choices=["mmap", "infer"])
    g.add_argument("--mock-data", action="store_true", help="synthetic token stream, no dataset needed")
    g.add_argument("--data-cache-path", type=str, default=None,
                   help="directory for the datasets' index caches (Megatron-LM; default: next to the data)")
    g.add_argument("--num-workers", type=int, default=0)
    g.add_argument("--eod-mask-loss", action="store_true",
                   help="no loss on the prediction made at an end-of-document token")
    g.add_argument("--reset-position-ids", action="store_true",
                   help="positions restart at 0 after each end-of-document token")
    g.add_argument("--reset-attention-mask", action="store_true",
                   help="no attention across an end-of-document token (each document sees only itself)")


def _add_logging_args(parser):
    g = parser.add_argument_group("logging")
    g.add_argument("--log-interval", type=int, default=100)
    g.add_argument("--tensorboard-dir", type=str, default=None)
    g.add_argument("--tensorboard-queue-size", type=int, default=1000)
    g.add_argument("--tensorboard-log-interval", type=int, default=1)
    g.add_argument("--log-timers-to-tensorboard", action="store_true")
    g.add_argument("--timing-log-option", choices=["max", "minmax", "all"], default=None,
                   help="Megatron-LM: every rank's iteration time at each log line: the max, (min, max) or each "
                        "rank's, with the slowest rank named (default: not gathered)")
    # both forks and Megatron-LM: the TensorBoard scalars also to Weights & Biases (the last rank's)
    g.add_argument("--wandb-project", type=str, default="", help="the W&B project; empty: no W&B (the default)")
    g.add_argument("--wandb-exp-name", type=str, default="", help="the W&B run's name (needed with --wandb-project)")
    g.add_argument("--wandb-entity", type=str, default="",
                   help="Megatron-LM: the W&B team or user the run belongs to (default: wandb's own)")
    g.add_argument("--wandb-save-dir", type=str, default="",
                   help="where W&B writes its files locally (default: --save/wandb)")
    g.add_argument("--log-progress", action="store_true",
                   help="Megatron-LM: progress.txt in --save, a line per job start and per checkpoint with the "
                        "throughput, FLOPs and tokens so far")
    g.add_argument("--log-batch-size-to-tensorboard", action="store_true")
    g.add_argument("--log-validation-ppl-to-tensorboard", action="store_true")
    # the forks' switches (tags as in Microsoft's training_log): the loss scale is on by default
    g.add_argument("--no-log-loss-scale-to-tensorboard", action="store_false", dest="log_loss_scale_to_tensorboard",
                   help="no loss-scale/loss-scale scalars (fp16)")
    g.add_argument("--log-memory-to-tensorboard", action="store_true",
                   help="torch.cuda.memory_stats(): mem-reserved-bytes, mem-allocated-bytes, mem-allocated-count")
    g.add_argument("--log-world-size-to-tensorboard", action="store_true", help="world-size/world-size scalars")
    g.add_argument("--peak-tflops", type=float, default=None,
                   help="dense peak TFLOP/s of one device for MFU (default: looked up from the CUDA device name)")


def _add_activation_checkpoint_args(parser):
    g = parser.add_argument_group("activation checkpointing")
    g.add_argument("--deepspeed-activation-checkpointing", action="store_true")
    g.add_argument("--partition-activations", action="store_true")
    g.add_argument("--contigious-checkpointing", action="store_true")
    g.add_argument("--checkpoint-in-cpu", action="store_true")
    g.add_argument("--synchronize-each-layer", action="store_true")
    g.add_argument("--profile-backward", action="store_true")


def _add_moe_args(parser):
    """Megatron-DeepSpeed's DeepSpeed-MoE flags, same spellings and defaults."""
    g = parser.add_argument_group("mixture of experts")
    g.add_argument("--num-experts", type=int, nargs="+", default=[1],
                   help="experts per MoE layer: one value, or one per MoE layer (1 = dense)")
    g.add_argument("--expert-interval", type=int, default=2,
                   help="layer l (1-based) is an MoE layer when l is a multiple of this")
    g.add_argument("--topk", type=int, default=1, help="experts per token (top-k gating)")
    g.add_argument("--moe-expert-parallel-size", type=int, default=1,
                   help="expert-parallel ranks a layer's experts are spread over (divides the DP size)")
    g.add_argument("--mlp-type", type=str, default="standard", choices=["standard", "residual"],
                   help="residual: PR-MoE, a dense MLP next to the experts")
    g.add_argument("--moe-train-capacity-factor", type=float, default=1.0)
    g.add_argument("--moe-eval-capacity-factor", type=float, default=1.0)
    g.add_argument("--moe-min-capacity", type=int, default=4)
    g.add_argument("--moe-loss-coeff", type=float, default=0.1, help="weight of the load-balancing loss")
    g.add_argument("--disable-moe-token-dropping", action="store_false", dest="moe_token_dropping",
                   help="no capacity limit: every token reaches its experts")
    g.add_argument("--disable-moe-top2-2nd-expert-sampling", action="store_false",
                   dest="moe_top2_2nd_expert_sampling", help="top-2: argmax for the 2nd expert instead of sampling")
    g.add_argument("--create-moe-param-group", action="store_true",
                   help="separate optimizer parameter groups for the experts (needed by ZeRO)")
    g.add_argument("--enable-expert-tensor-parallelism", action="store_true",
                   help="split the experts over the TP ranks (default: whole experts, tokens split)")


def _add_published_script_args(parser):
    """Operational flags of the forks' published launch scripts (BigScience's training scripts,
    both forks' examples). Those with no effect here are listed in megatron/config/script_flags.py."""
    g = parser.add_argument_group("published scripts")
    levels = ["debug", "info", "warning", "error", "critical"]
    g.add_argument("--log-level", choices=levels, default=None,
                   help="Python / DeepSpeed logger level on rank 0 (BigScience)")
    g.add_argument("--log-level-replica", choices=levels, default=None,
                   help="Python / DeepSpeed logger level on every other rank (BigScience)")
    g.add_argument("--sync-tp-duplicated-parameters", action="store_true",
                   help="average the parameters every TP rank holds whole over TP before each forward (BigScience)")
    g.add_argument("--skip-train-iteration-range", nargs="+", default=None, metavar="START-END",
                   help="iterations that train nothing: their batches are read and dropped (BigScience)")
    g.add_argument("--log-optimizer-states-to-tensorboard", action="store_true",
                   help="norms of Adam's moments and the weights to TensorBoard every --log-interval (Microsoft)")
    g.add_argument("--valid-num-workers", type=int, default=None,
                   help="DataLoader workers of the validation split (default: --num-workers)")
    g.add_argument("--codecarbon-dir", type=str, default=None, help="accepted; no effect")
    g.add_argument("--abort-on-unmet-fused-kernel-constraints", action="store_true", help="accepted; no effect")
    g.add_argument("--no-async-tensor-model-parallel-allreduce", action="store_false",
                   dest="async_tensor_model_parallel_allreduce", help="accepted; no effect")
    for flag in ("--use-flash-attn", "--use-flash-attn-v2", "--use-flash-attn-triton", "--use-flash-attn-builder"):
        g.add_argument(flag, action="store_true", help="accepted; no effect (attention is exact either way)")
    g.add_argument("--ds-sequence-parallel-size", type=int, default=1,
                   help="DeepSpeed-Ulysses sequence parallelism: the sequence split over this many ranks, "
                        "attention all-to-all over heads (needs --no-pipeline-parallel, TP = PP = 1)")


def _add_fork_feature_args(parser):
    from megatron.config.fork_features import add_args  # recompute spellings, logging flags, refused features
    add_args(parser)


def _add_zero_args(parser):
    g = parser.add_argument_group("ZeRO")
    g.add_argument("--zero-stage", type=int, default=None, help="overrides the ds_config's stage")
    # the forks' other --zero-* flags (declared there, read by no code: their launch scripts write
    # the same values into the ds_config); here they fill zero_optimization, which must agree
    g.add_argument("--zero-reduce-scatter", action="store_true", help="zero_optimization.reduce_scatter true")
    g.add_argument("--zero-contigious-gradients", action="store_true",
                   help="zero_optimization.contiguous_gradients true")
    g.add_argument("--zero-reduce-bucket-size", type=int, default=0,
                   help="zero_optimization.reduce_bucket_size (elements; 0: the ds_config's or DeepSpeed's)")
    g.add_argument("--zero-allgather-bucket-size", type=int, default=0,
                   help="zero_optimization.allgather_bucket_size (elements; 0: the ds_config's or DeepSpeed's)")
