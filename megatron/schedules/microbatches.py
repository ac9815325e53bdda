"""Global batch size and the number of micro-batches per iteration, with Megatron's
--rampup-batch-size <start> <increment> <ramp-up samples>: the global batch grows from <start>
by <increment> in equal sample intervals until it reaches --global-batch-size."""
import math
from argparse import Namespace
from collections.abc import Sequence


class NumMicroBatchesCalculator:
    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 rampup_batch_size: Sequence[int] | None = None) -> None:
        self.final_global_batch_size = global_batch_size
        self.micro_batch_times_dp = micro_batch_size * data_parallel_size
        self.rampup = rampup_batch_size
        self.update(0)

    def update(self, consumed_samples: int) -> None:
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

    def get(self) -> int:
        return self.num_micro_batches

    def get_current_global_batch_size(self) -> int:
        return self.current_global_batch_size


def run_length(args: Namespace) -> tuple[int, int]:
    """(iterations, samples) of the whole run: it stops at --train-iters or --train-samples, or
    earlier once --train-tokens tokens are consumed (Microsoft's fork keeps both limits), while the
    global batch ramps up and a sequence-length curriculum (args.curriculum) trains shorter samples:
    iteration i consumes its global batch x the length it trains at, as the Trainer counts it."""
    iteration_cap = args.train_iters if args.train_iters is not None else math.inf
    sample_cap = args.train_samples if args.train_samples is not None else math.inf
    token_cap = getattr(args, "train_tokens", None)
    token_cap = math.inf if token_cap is None else token_cap
    curriculum = getattr(args, "curriculum", None)
    steady_from = curriculum.steady_from() if curriculum else 1  # the first iteration of the final length
    calculator = NumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size,
                                           args.data_parallel_size, args.rampup_batch_size)
    iterations = consumed = tokens = 0
    while iterations < iteration_cap and consumed < sample_cap and tokens < token_cap:
        gbs = calculator.get_current_global_batch_size()
        seqlen = curriculum.seqlen(iterations + 1) if curriculum else args.seq_length
        if gbs == calculator.final_global_batch_size and iterations + 1 >= steady_from:
            # neither the batch nor the length changes any more: the rest in one step
            rest = iteration_cap - iterations
            if sample_cap < math.inf:
                rest = min(rest, -(-(sample_cap - consumed) // gbs))
            if token_cap < math.inf:
                rest = min(rest, -(-(token_cap - tokens) // (gbs * seqlen)))
            # validate_args requires --train-iters or --train-samples: one cap is finite, rest an int
            return iterations + rest, consumed + rest * gbs  # type: ignore[return-value]
        consumed += gbs
        tokens += gbs * seqlen
        iterations += 1
        calculator.update(consumed)
    return iterations, consumed


def train_samples(args: Namespace) -> int:
    """Samples the training split is sized for: all that the run's iterations read. That is more than
    --train-samples when the last iteration's global batch passes it (a ramp-up's batch sizes, or a
    --train-samples that is not a multiple of the batch): a split of exactly --train-samples would
    run dry in the last iteration (StopIteration in DeepSpeed's loader). Every dataset kind (mock,
    indexed, blends, weighted split paths) is asked for this many, as the forks' whole epochs give."""
    return run_length(args)[1]


def num_train_iterations(args: Namespace) -> int:
    """Iterations of the run (see run_length)."""
    return run_length(args)[0]
