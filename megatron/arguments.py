"""Megatron-DeepSpeed command line: the same flags and meanings, so existing launch scripts run
unchanged, and ALL validation in one place, run on every rank before any heavy work."""
import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import cast

from megatron.model.shape import (  # noqa: F401
    GLU_ACTIVATIONS,
    POSITION_EMBEDDING_ALIASES,
    ConfigError,
    ModelShape,
    require_fraction,
    require_non_negative,
    require_positive,
)
from megatron.model.shape import require as _require
from megatron.run_config import RunArgs, as_run_args
from megatron.tokenizer.external import PATH_FLAG, tokenizer_path
from megatron.tokenizer.tokenizer import TOKENIZER_TYPES


def parse_args(extra_args_provider: Callable | None = None, args_list: list[str] | None = None) -> argparse.Namespace:
    from megatron.script_flags import given_flags
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
    # Megatron's kernel-fusion switches: this code base runs unfused ops, so "no fusion" is
    # what it does anyway; accepted so existing launch scripts run unchanged.
    for flag in ("--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
                 "--no-gradient-accumulation-fusion"):
        g.add_argument(flag, action="store_true", help="accepted; no fused kernels are used")
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


def _add_regularization_args(parser):
    g = parser.add_argument_group("regularization")
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--sgd-momentum", type=float, default=0.9)


def _add_training_args(parser):
    g = parser.add_argument_group("training")
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
    # iteration, saves and exits 0 (megatron/exit_signal.py)
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="save a checkpoint and exit when --exit-signal arrives at any rank or the launcher exits")
    g.add_argument("--exit-signal", choices=["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"], default="SIGTERM",
                   help="the signal --exit-signal-handler acts on")
    # Megatron-LM's: on by default; a non-finite loss or gradient norm stops the run without a save
    g.add_argument("--no-check-for-nan-in-loss-and-grad", action="store_false", dest="check_for_nan_in_loss_and_grad",
                   help="train on through a non-finite loss or gradient norm")
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


def _add_learning_rate_args(parser):
    g = parser.add_argument_group("learning rate")
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine"], default="linear")
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
    g.add_argument("--kill-switch-path", type=str, default=None,
                   help="when this file exists, every rank saves a checkpoint and exits (BigScience's fork)")
    g.add_argument("--universal-checkpoint", action="store_true",
                   help="--load the output of DeepSpeed's ds_to_universal.py named by DIR/latest_universal")


def _add_mixed_precision_args(parser):
    g = parser.add_argument_group("mixed precision")
    g.add_argument("--fp16", action="store_true")
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="Megatron's fp32 gradient accumulation: the ds_config's data_types.grad_accum_dtype fp32 "
                        "(16-bit weights: with ZeRO)")
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
    g.add_argument("--eod-mask-loss", action="store_true")


def _add_logging_args(parser):
    g = parser.add_argument_group("logging")
    g.add_argument("--log-interval", type=int, default=100)
    g.add_argument("--tensorboard-dir", type=str, default=None)
    g.add_argument("--tensorboard-queue-size", type=int, default=1000)
    g.add_argument("--tensorboard-log-interval", type=int, default=1)
    g.add_argument("--log-timers-to-tensorboard", action="store_true")
    g.add_argument("--log-batch-size-to-tensorboard", action="store_true")
    g.add_argument("--log-validation-ppl-to-tensorboard", action="store_true")
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
    both forks' examples). Those with no effect here are listed in megatron/script_flags.py."""
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
    g.add_argument("--no-query-key-layer-scaling", action="store_false", dest="apply_query_key_layer_scaling",
                   help="accepted; no effect (never applied here)")
    g.add_argument("--ds-sequence-parallel-size", type=int, default=1,
                   help="DeepSpeed-Ulysses sequence parallelism: the sequence split over this many ranks, "
                        "attention all-to-all over heads (needs --no-pipeline-parallel, TP = PP = 1)")


def _add_fork_feature_args(parser):
    from megatron.fork_features import add_args  # recompute spellings, logging flags, refused features
    add_args(parser)


def _add_zero_args(parser):
    g = parser.add_argument_group("ZeRO")
    g.add_argument("--zero-stage", type=int, default=None, help="overrides the ds_config's stage")


# --------------------------------------------------------------------------------------------
# validation

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
            "--lr-decay-tokens", "--log-interval", "--tensorboard-queue-size", "--tensorboard-log-interval",
            "--ds-sequence-parallel-size", "--adam-eps", "--layernorm-epsilon", "--init-method-std",
            "--word-embedding-init-std", "--loss-scale", "--initial-loss-scale", "--min-loss-scale",
            "--loss-scale-window", "--hysteresis")
NON_NEGATIVE = ("--lr", "--min-lr", "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-tokens", "--eval-iters",
                "--num-workers", "--valid-num-workers", "--weight-decay", "--clip-grad", "--seed", "--zero-stage")
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
    from megatron.fork_features import check_logging_flags, refuse_and_map
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
    _validate_sequence_parallel(args)
    _validate_batch_sizes(args)
    _validate_training_length(args)
    if args.skip_train_iteration_range:
        from megatron.skip_iterations import parse_ranges
        args.skip_train_iteration_range = parse_ranges(args.skip_train_iteration_range)
    _validate_precision(args, cuda_available)
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
    from megatron.learning_rates import schedule_lengths
    (warmup, decay), (warmup_tokens, decay_tokens) = schedule_lengths(args)
    if warmup_tokens is not None or decay_tokens is not None:
        seq = args.seq_length
        warmup_tokens = warmup * seq if warmup_tokens is None else warmup_tokens
        decay_tokens = decay * seq if decay_tokens is None else decay_tokens
        _require(warmup_tokens < decay_tokens,
                 f"the warmup ({warmup_tokens} tokens) must end before the decay ({decay_tokens} tokens) does: "
                 f"lower --lr-warmup-tokens or raise --lr-decay-tokens")


def _validate_precision(args, cuda_available):
    _require(not (args.fp16 and args.bf16), "--fp16 and --bf16 are exclusive: pick one")
    _require(not args.fp16 or cuda_available,
             "--fp16 needs a CUDA device: on CPU train in fp32 (drop --fp16) or use --bf16")
    import torch
    args.params_dtype = torch.half if args.fp16 else (torch.bfloat16 if args.bf16 else torch.float32)


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
    to run (megatron/curriculum.py): DeepSpeed 0.19 rejects the key, so it leaves the config here.
    A disabled block is dropped with a startup note; an enabled one becomes args.curriculum."""
    from megatron.curriculum import parse_curriculum
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

    from megatron.deepspeed_internals import grad_accum_dtype_name, parsed_config
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
