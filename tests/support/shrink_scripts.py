"""Published launch scripts shrunk to tiny sizes for a CPU run, every flag kept (the families of
tests/integration/test_published_families.py and the flag table's scripts)."""
import json
import os

from tests.conftest import ROOT

# The scripts that train in fp16 (MoE, rope, checkpointing, Ulysses): fp16 needs CUDA and stops a
# CPU run with one line (megatron/config/arguments.py), so their tiny versions train in fp32. bf16 stays.
DROPPED = {"--fp16": "fp16 needs a CUDA device; the CPU run trains in fp32"}


# what shrink may change: sizes, lengths, intervals, parallel sizes for two ranks, data, tokenizer
# and output paths; plus the backend (nccl needs CUDA: one line on CPU) and Ulysses' SP (4 -> 1,
# the only value supported)
SHRINKABLE = {f"--{name}" for name in (
    "num-layers hidden-size ffn-hidden-size num-attention-heads num-key-value-heads seq-length "
    "max-position-embeddings micro-batch-size global-batch-size rampup-batch-size train-iters train-samples "
    "train-tokens lr-warmup-iters lr-warmup-samples lr-warmup-tokens lr-decay-samples lr-decay-tokens "
    "eval-interval eval-iters save-interval log-interval tensor-model-parallel-size "
    "pipeline-model-parallel-size num-experts moe-expert-parallel-size ds-sequence-parallel-size data-path "
    "vocab-file merge-file tokenizer-name-or-path tokenizer-model pad-vocab-size-to deepspeed_config save load "
    "tensorboard-dir kill-switch-path train-weighted-split-paths-path valid-weighted-split-paths-path "
    "distributed-backend").split()}


def flags_and_values(argv):
    out = []
    for a in argv:
        if a.startswith("--"):
            name, _, value = a.partition("=")
            out.append((name, [value] if value else []))
        else:
            out[-1][1].append(a)
    return out


def flag_names(argv):
    return [a.split("=")[0] for a in argv if a.startswith("--")]


def set_values(argv, flag, *values):
    """Replace the values after `flag` (up to the next flag, or the `flag=value` form) with `values`."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == flag:
            end = i + 1
            while end < len(out) and not out[end].startswith("--"):
                end += 1
            return out[:i + 1] + [str(v) for v in values] + out[end:]
        if a.startswith(flag + "="):
            assert len(values) == 1
            out[i] = f"{flag}={values[0]}"
            return out
    raise AssertionError(f"{flag} is not in the published list")


def drop(argv, flag):
    assert flag in DROPPED and argv.count(flag) == 1
    return [a for a in argv if a != flag]


def shrink(argv, sizes):
    """sizes: {flag: value or tuple of values} -- sizes, lengths, paths only (checked by the tests)."""
    for flag, values in sizes.items():
        argv = set_values(argv, flag, *(values if isinstance(values, tuple) else (values,)))
    return argv


def ds_config(tmp, name, precision=None, zero_stage=0, extra=None):
    """The forks' ds_config templates, small: micro batch, clipping, ZeRO stage and the script's
    precision (the trainer fills the batch sizes from the flags); `extra`: the template's other keys."""
    config = {"gradient_clipping": 1.0, "zero_optimization": {"stage": zero_stage}, "steps_per_print": 2000,
              "wall_clock_breakdown": False, **(extra or {})}
    if precision:
        config[precision] = {"enabled": True}
    path = tmp / f"{name}_ds_config.json"
    path.write_text(json.dumps(config))
    return str(path)


def outputs(tmp, name, argv):
    """Checkpoints and TensorBoard under tmp, for those of the three the script passes."""
    dirs = {"--save": tmp / name / "ckpt", "--load": tmp / name / "ckpt", "--tensorboard-dir": tmp / name / "tb"}
    return {flag: path for flag, path in dirs.items() if flag in argv}


GPT2 = {"--vocab-file": os.path.join(ROOT, "data", "gpt2-vocab.json"),
        "--merge-file": os.path.join(ROOT, "data", "gpt2-merges.txt")}
GPT2_PADDED = 8192  # the bundled GPT-2 files: 8192 entries, already a multiple of 128 x TP (1 or 2)

# the dense GPT layer at hidden h, ffn 4h, with biases: QKV 3h^2+3h, dense h^2+h, MLP 8h^2+5h, two LayerNorms 4h
