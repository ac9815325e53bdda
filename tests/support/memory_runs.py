"""The trainer's first iteration on real gloo ranks with its memory measured (megatron/memory_measure.py),
for the memory tests: `first_iteration` runs on every rank (tests/support/distributed.py), `check_exact`
compares the prediction with what the ranks hold."""

# the TINY trainer config of the launch tests: 2 layers, hidden 64, 4 heads, seq 32, vocab 600 -> 640
FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "2", "--lr", "1e-3", "--mock-data", "--vocab-size", "600", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--train-iters", "4", "--seed", "1234"]
S = 32


def first_iteration(flags):
    """Build the trainer's engine as pretrain() does, run one iteration, measure."""
    return first_iteration_and_loss(flags)[0]


def first_iteration_and_loss(flags):
    """first_iteration's rows, the losses of the first two iterations and the first step's
    gradient norm as DeepSpeed's engine computed it (the second loss and the norm carry the
    first step's gradient reduction). The batches depend on the DP rank only: the SP ranks of a
    replica (DeepSpeed-Ulysses) and the TP ranks read the same samples, and DP ranks together read
    what one rank reads in its micro-batches."""
    import torch
    import torch.distributed as dist

    import pretrain_gpt
    from megatron import mpu
    from megatron.config.arguments import parse_args
    from megatron.config.run_config import RunConfig, freeze_args
    from megatron.config.validation import validate_args
    from megatron.runtime.global_vars import set_args
    from megatron.runtime.parallel_layout import ParallelLayout
    from megatron.training import Trainer, initialize

    args = parse_args(args_list=FLAGS + flags)
    validate_args(args, world_size=dist.get_world_size(), cuda_available=False)
    args.rank = dist.get_rank()
    set_args(args)
    resume = initialize._build_tokenizer(args)
    args = freeze_args(args, RunConfig.from_args(args, ParallelLayout.from_args(args), resume))
    trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    # one stream of micro-batches whatever the layout: an iteration's global batch is the next
    # dp x m of them, DP rank d reading its m in a row (one rank reads them all, in order)
    dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    m = args.global_batch_size // (args.micro_batch_size * dp)
    stream = torch.randint(0, 600, (16 * dp, args.micro_batch_size, S + 1), generator=torch.Generator().manual_seed(0))
    batches = iter([pretrain_gpt.get_batch({"text": stream[k // m * dp * m + d * m + k % m]}) for k in range(16)])
    loss = trainer.steps.train_batch(batches)
    grad_norm = trainer.engine.get_global_grad_norm()
    rows = [(rank, stage, tp, dp, predicted._asdict(), measured)
            for rank, stage, tp, dp, predicted, measured in trainer.measure_memory()]
    return rows, [float(loss), float(trainer.steps.train_batch(batches))], float(grad_norm)


def check_exact(rows):
    for rank, stage, tp, dp, predicted, measured in rows:
        for field in ("weights", "gradients", "optimizer"):
            assert predicted[field] == measured[field], (
                f"rank {rank} (stage {stage}, tp {tp}, dp {dp}) {field}: "
                f"predicted {predicted[field]:,}, measured {measured[field]:,}")

