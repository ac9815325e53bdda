"""After initialize_megatron the run configuration is immutable: its dataclasses refuse writes, and
args refuses any late write except the parameter-count cache (megatron/config/run_config.py)."""
import dataclasses
import operator

from tests.support.distributed import run_distributed

FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-4",
         "--mock-data", "--vocab-size", "600", "--make-vocab-size-divisible-by", "64"]


def _attempt(write):
    try:
        write()
    except Exception as e:  # noqa: BLE001 - the type and message are what is checked
        return type(e).__name__, str(e)
    return None


def _initialized():
    from megatron.runtime.global_vars import get_args
    from megatron.training.initialize import initialize_megatron
    args = initialize_megatron(args_list=FLAGS)
    config = args.run_config
    refused = {
        "shape": _attempt(lambda: setattr(config, "model_shape", None)),
        "layout": _attempt(lambda: setattr(config.parallel, "data_parallel_size", 2)),
        "batch": _attempt(lambda: setattr(config.batch, "global_batch_size", 8)),
        "optimizer": _attempt(lambda: setattr(config.optimizer, "lr", 1.0)),
        "model_shape.vocab": _attempt(lambda: setattr(config.model_shape, "vocab_size", 1)),
        "ds_config": _attempt(lambda: operator.setitem(config.deepspeed_config, "train_batch_size", 8)),
        "ds_config nested": _attempt(
            lambda: operator.setitem(config.deepspeed_config["zero_optimization"], "stage", 3)),
        "args.lr": _attempt(lambda: setattr(args, "lr", 1.0)),
        "args.padded_vocab_size": _attempt(lambda: setattr(args, "padded_vocab_size", 1)),
        "del args.seed": _attempt(lambda: delattr(args, "seed")),
    }
    # the layout owns the parallel sizes: args reads them off it (shown by changing the frozen value
    # behind its back), the process groups were built from it, a shape of another TP x PP is refused
    from megatron import mpu
    sizes = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size)
    object.__setattr__(config.parallel, "data_parallel_size", 3)
    reads_layout = (args.data_parallel_size, vars(args)["data_parallel_size"])
    object.__setattr__(config.parallel, "data_parallel_size", 1)
    groups = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size(),
              mpu.get_data_parallel_world_size())
    other_shape = dataclasses.replace(config.model_shape, tensor_model_parallel_size=2)
    mismatch = _attempt(lambda: dataclasses.replace(config, model_shape=other_shape))
    write_dp = _attempt(lambda: setattr(args, "data_parallel_size", 2))
    cache = _attempt(lambda: setattr(get_args(), "parameters", 123))  # the one late write allowed
    cache_again = _attempt(lambda: setattr(args, "parameters", 456))  # ... once
    ds_copy = config.deepspeed_config_dict()
    ds_copy["zero_optimization"]["stage"] = 3  # a copy for DeepSpeed: writable, the original unchanged
    return {"refused": refused, "cache": cache, "cache_again": cache_again, "parameters": args.parameters,
            "same": get_args() is args,
            "stage": config.deepspeed_config["zero_optimization"]["stage"],
            "derived": (args.padded_vocab_size, args.ffn_hidden_size, args.kv_channels, args.max_position_embeddings,
                        args.num_key_value_heads, args.make_vocab_size_divisible_by),
            "layout": dataclasses.astuple(config.parallel), "batch": dataclasses.astuple(config.batch),
            "gbs": args.global_batch_size, "sizes": sizes, "reads_layout": reads_layout, "groups": groups,
            "mismatch": mismatch, "write_dp": write_dp,
            "sections": [dataclasses.astuple(s) for s in (config.lr_schedule, config.evaluation, config.exit,
                                                          config.data)],
            "section_write": _attempt(lambda: setattr(config.evaluation, "eval_iters", 1))}


def test_configuration_is_frozen_after_initialization():
    out = run_distributed(1, _initialized)[0]
    refused = out["refused"]
    for name in ("shape", "layout", "batch", "optimizer", "model_shape.vocab"):
        assert refused[name] is not None and refused[name][0] == "FrozenInstanceError", name
    for name in ("ds_config", "ds_config nested"):
        assert refused[name] is not None and refused[name][0] == "TypeError", name  # a read-only mapping
    kind, message = refused["args.lr"]
    assert kind == "FrozenArgsError"
    assert message.startswith("args.lr: args is read-only after initialize_megatron") and "\n" not in message
    assert refused["args.padded_vocab_size"][0] == "FrozenArgsError"
    assert refused["del args.seed"][0] == "FrozenArgsError"
    assert out["cache"] is None and out["parameters"] == 123 and out["same"]
    assert out["cache_again"][0] == "FrozenArgsError" and "written once" in out["cache_again"][1]
    assert out["stage"] == 0  # the copy's write did not reach the frozen config
    # by hand: 600 tokens padded to a multiple of 64 x TP 1 = 640; ffn 4 x 64; head dim 64 / 4 heads;
    # the position table defaults to the sequence; kv heads default to the heads
    assert out["derived"] == (640, 256, 16, 32, 4, 64)
    # TP, PP, DP, EP, world size, rank, pipeline engine; mbs, gbs, no ramp-up, seq, iters, samples, tokens
    assert out["layout"] == (1, 1, 1, 1, 1, 0, True, 1)  # ..., the pipeline engine, SP 1
    assert out["batch"] == (2, 4, None, 32, 2, None, None) and out["gbs"] == 4
    assert out["sizes"] == out["groups"] == (1, 1, 1)
    assert out["reads_layout"] == (3, 1)  # the layout's value; vars(args) keeps the validated one
    assert out["mismatch"][0] == "RuntimeError" and "differs from the parallel layout's 1 x 1" in out["mismatch"][1]
    assert out["write_dp"][0] == "FrozenArgsError"
    # the Trainer's sections, from FLAGS and the flags' defaults: lr 1e-4 to --min-lr 0 (linear decay),
    # no warmup, decay over --train-iters 2 x global batch 4 = 8 samples, 32 tokens a sample, no token
    # lengths; --eval-interval 1000 of --eval-iters 100; no exit flag, no signal handler (SIGTERM its
    # signal), the NaN check on, the spike check off
    lr_schedule, evaluation, exit_settings, data = out["sections"]
    # no WSD cool-down (default shape exponential); a constant weight decay: --weight-decay (0.01) at
    # both ends, over the run's 8 samples (2 iterations x a global batch of 4)
    assert lr_schedule == (1e-4, 0.0, "linear", 0, 8, None, None, 32, False, False, None, None, "exponential",
                           0.01, 0.01, 8, "constant")
    assert evaluation == (1000, 100) and exit_settings == (None, None, None, False, "SIGTERM", True, False)
    # micro batch 2, global batch 4, the training split sized for 2 iterations x 4 = 8 samples, no
    # loader workers (--num-workers 0), none set for validation, no skipped iterations
    assert data == (2, 4, 8, 0, None, None)
    assert out["section_write"][0] == "FrozenInstanceError"
