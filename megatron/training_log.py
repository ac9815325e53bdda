"""The per-iteration log line and TensorBoard scalars (Megatron-DeepSpeed tag names).

Everything here reads cached numbers (args.parameters*, args.flops_per_sample) and the values
the training step handed over: no collective, no walk over the model's parameters."""
import math

from megatron import print_rank_last
from megatron.global_vars import get_tensorboard_writer
from megatron.mfu import interval_mfu


def log_model_size(args):
    """Once, at step 0, for the arch-and-scaling dashboards."""
    writer = get_tensorboard_writer()
    if writer is not None:
        writer.add_scalar("model/parameters", args.parameters, 0)
        writer.add_scalar("model/parameters without embeddings", args.parameters_no_embedding, 0)


def throughput(samples, elapsed, args):
    """(samples/s, tokens/s, TFLOPs per GPU) over a logging interval of `samples` samples."""
    samples_per_second = samples / elapsed
    tflops = args.flops_per_sample * samples / (elapsed * args.world_size * 1e12)
    return samples_per_second, samples_per_second * args.seq_length, tflops


def training_log(interval, elapsed, lr_scheduler, engine, global_batch_size, args):
    iterations = interval["iterations"]
    loss = float(interval["loss"]) / iterations
    lr = lr_scheduler.get_lr()
    grad_norm = engine.get_global_grad_norm()
    grad_norm = None if grad_norm is None else float(grad_norm)
    samples_per_second, tokens_per_second, tflops = throughput(interval["samples"], elapsed, args)
    mfu = interval_mfu(interval["samples"], elapsed, args)  # None without a known peak
    dp = args.data_parallel_size

    writer = get_tensorboard_writer()
    if writer is not None:
        it, samples, tokens = args.iteration, args.consumed_train_samples, args.consumed_train_samples * args.seq_length
        writer.add_scalar("learning-rate/learning-rate", lr, it)
        writer.add_scalar("learning-rate/learning-rate vs samples", lr, samples)
        if args.log_batch_size_to_tensorboard:
            writer.add_scalar("batch-size/batch-size", global_batch_size, it)
            writer.add_scalar("batch-size/batch-size vs samples", global_batch_size, samples)
        writer.add_scalar("lm-loss-training/lm loss", loss, it)
        writer.add_scalar("lm-loss-training/lm loss vs samples", loss, samples)
        writer.add_scalar("lm-loss-training/lm loss vs tokens", loss, tokens)
        writer.add_scalar("lm-loss-training/lm loss vs gigaflos (without embeddings)", loss,
                          args.gigaflos_no_embeds)
        if grad_norm is not None:
            writer.add_scalar("grad-norm/grad-norm", grad_norm, it)
        if args.log_timers_to_tensorboard:
            writer.add_scalar("iteration-time/iteration-time", elapsed / iterations, it)
        writer.add_scalar("iteration-time/samples per second", samples_per_second, it)
        writer.add_scalar("iteration-time/samples per second per replica", samples_per_second / dp, it)
        writer.add_scalar("iteration-time/tokens per second", tokens_per_second, it)
        writer.add_scalar("iteration-time/tokens per second per replica", tokens_per_second / dp, it)
        writer.add_scalar("iteration-time/TFLOPs per gpu (estimated)", tflops, it)
        if mfu is not None:
            writer.add_scalar("iteration-time/MFU", mfu, it)

    line = (f" iteration {args.iteration:8d}/{args.total_iterations:8d} |"
            f" consumed samples: {args.consumed_train_samples:12d} |"
            f" elapsed time per iteration (ms): {1000.0 * elapsed / iterations:.1f} |"
            f" learning rate: {lr:.3E} |"
            f" global batch size: {global_batch_size:5d} |"
            f" lm loss: {loss:.6E} |")
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    line += f" samples per second: {samples_per_second:.3f} | TFLOPs: {tflops:.2f} |"
    if mfu is not None:
        line += f" MFU: {100 * mfu:.2f}% |"
    print_rank_last(line)


def evaluation_log(prefix, loss, args, tensorboard=True):
    ppl = math.exp(min(20.0, loss))
    writer = get_tensorboard_writer()
    if writer is not None and tensorboard:
        it, samples = args.iteration, args.consumed_train_samples
        tokens = samples * args.seq_length
        writer.add_scalar("lm-loss-validation/lm loss validation", loss, it)
        writer.add_scalar("lm-loss-validation/lm loss validation vs samples", loss, samples)
        writer.add_scalar("lm-loss-validation/lm loss validation vs tokens", loss, tokens)
        writer.add_scalar("lm-loss-validation/lm loss validation vs gigaflos (without embeddings)", loss,
                          args.gigaflos_no_embeds)
        if args.log_validation_ppl_to_tensorboard:
            writer.add_scalar("lm-loss-validation/lm loss validation ppl", ppl, it)
            writer.add_scalar("lm-loss-validation/lm loss validation ppl vs samples", ppl, samples)
            writer.add_scalar("lm-loss-validation/lm loss validation ppl vs tokens", ppl, tokens)
            writer.add_scalar("lm-loss-validation/lm loss validation ppl vs gigaflos (without embeddings)",
                              ppl, args.gigaflos_no_embeds)
    bar = "-" * 100
    print_rank_last(f"{bar}\n validation loss at {prefix} | lm loss value: {loss:.6E} | lm loss PPL: {ppl:.6E} |\n{bar}")
