"""Global batch size and the number of micro-batches per iteration, with Megatron's
--rampup-batch-size <start> <increment> <ramp-up samples>: the global batch grows from <start>
by <increment> in equal sample intervals until it reaches --global-batch-size."""


class NumMicroBatchesCalculator:
    def __init__(self, global_batch_size, micro_batch_size, data_parallel_size, rampup_batch_size=None):
        self.final_global_batch_size = global_batch_size
        self.micro_batch_times_dp = micro_batch_size * data_parallel_size
        self.rampup = rampup_batch_size
        self.update(0)

    def update(self, consumed_samples):
        if self.rampup is None:
            gbs = self.final_global_batch_size
        else:
            start, increment, ramp_samples = self.rampup
            steps = (self.final_global_batch_size - start) // increment
            samples_per_step = ramp_samples / steps if steps else 0
            if steps == 0 or consumed_samples >= ramp_samples:
                gbs = self.final_global_batch_size
            else:
                gbs = start + int(consumed_samples / samples_per_step) * increment
        self.current_global_batch_size = gbs
        self.num_micro_batches = gbs // self.micro_batch_times_dp

    def get(self):
        return self.num_micro_batches

    def get_current_global_batch_size(self):
        return self.current_global_batch_size


def num_train_iterations(args):
    """Iterations of the run: --train-iters, or enough to consume --train-samples while the
    global batch ramps up."""
    if args.train_iters is not None:
        return args.train_iters
    calculator = NumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size,
                                           args.data_parallel_size, args.rampup_batch_size)
    iterations = consumed = 0
    while consumed < args.train_samples:
        consumed += calculator.get_current_global_batch_size()
        iterations += 1
        calculator.update(consumed)
    return iterations
