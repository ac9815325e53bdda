"""--check-for-nan-in-loss-and-grad and --check-for-spiky-loss decide on every rank together
(megatron/training/loss_check.py agree_on_loss, which Trainer.check_loss calls: one MAX all-reduce
over gloo): a loss that is not finite on one rank only (each DP rank has its own loss
under --no-pipeline-parallel), a gradient norm that is not finite on one rank only, stop every rank;
a step the engine skipped (the loss scaler's overflow) and a step without a computed norm are
judged by what they have. Two real ranks; each rank's engine is the two answers the check asks a
DeepSpeed engine for (whether the step was applied, the cached global gradient norm), given per
case, so that one rank alone can be made non-finite or spiky -- the all-reduce and the decision are
the trainer's own. Real runs that go non-finite are in tests/integration/test_exit_signal.py, one
that spikes in tests/integration/test_loss_stops.py."""
import math
from types import SimpleNamespace

from tests.support.distributed import run_distributed

INF, NAN = math.inf, math.nan


class _Answers:
    """What the check asks the engine, fixed: was the step applied, the global gradient norm."""

    def __init__(self, applied, grad_norm):
        self.applied, self.grad_norm = applied, grad_norm

    def was_step_applied(self):
        return self.applied

    def get_global_grad_norm(self):
        return self.grad_norm


def _trainer(applied=True, grad_norm=1.0, nan_check=True, spiky_check=False, samples=2):
    """What Trainer.check_loss reads of a Trainer (the engine's answers fixed per call)."""
    from megatron.schedules.progress import TrainingProgress
    from megatron.training.trainer import Trainer
    exit_settings = SimpleNamespace(check_for_nan_in_loss_and_grad=nan_check, check_for_spiky_loss=spiky_check)
    trainer = SimpleNamespace(engine=_Answers(applied, grad_norm), exit=exit_settings, progress=TrainingProgress(),
                              spiky_loss_samples=samples)
    return trainer, lambda loss: Trainer.check_loss(trainer, loss)


def _decide(cases):
    import torch
    rank = torch.distributed.get_rank()
    decided = []
    for case in cases:
        loss, applied, grad_norm = case[rank]
        _, check = _trainer(applied, grad_norm)
        decided.append(check(torch.tensor(loss))[0] == "non-finite")
    return decided


# (rank 0's, rank 1's) (loss, step applied, gradient norm), and whether the run must stop
CASES = {
    "all finite": (((2.5, True, 1.0), (2.5, True, 1.0)), False),
    "large but finite": (((1e30, True, 3.4e38), (-3.0, True, 0.0)), False),
    "loss inf on the last rank only": (((2.5, True, 1.0), (INF, True, 1.0)), True),
    "loss nan on the first rank only": (((NAN, True, 1.0), (2.5, True, 1.0)), True),
    "grad norm nan on one rank only": (((2.5, True, NAN), (2.5, True, 1.0)), True),
    "grad norm inf, as a float tensor": (((2.5, True, 1.0), (2.5, True, INF)), True),
    "overflow step skipped by the engine": (((INF, False, INF), (INF, False, INF)), False),
    "no norm computed, finite loss": (((2.5, True, None), (2.5, True, None)), False),
    "no norm computed, loss inf on one rank": (((2.5, True, None), (-INF, True, None)), True),
}


def test_every_rank_stops_when_one_rank_sees_a_non_finite_loss_or_norm():
    names = list(CASES)
    ranks = run_distributed(2, _decide, [CASES[n][0] for n in names])
    expected = [CASES[n][1] for n in names]
    for rank, decided in enumerate(ranks):
        assert dict(zip(names, decided, strict=True)) == dict(zip(names, expected, strict=True)), rank
        assert all(type(d) is bool for d in decided)


def _spikes(sequences, nan_check):
    """Each rank's losses in turn through one trainer's check (reference: the first 2 losses)."""
    import torch
    rank = torch.distributed.get_rank()
    trainer, check = _trainer(nan_check=nan_check, spiky_check=True, samples=2)
    decided = [check(torch.tensor(losses[rank]))[0] for losses in sequences]
    return decided, trainer.progress.spiky_loss_max


# (rank 0's loss, rank 1's) per iteration. The reference is the largest of either rank's first two
# losses: 4.0 (rank 1's first), so 40.0 on any one rank is a spike for both
SPIKE_ON_RANK_1 = [(2.0, 4.0), (3.0, 1.0), (30.0, 5.0), (2.0, 40.0)]
SPIKE_ON_RANK_0 = [(2.0, 4.0), (3.0, 1.0), (41.0, 3.0)]
NAN_NEXT_TO_A_SPIKE = [(2.0, 4.0), (3.0, 1.0), (NAN, 50.0)]


def test_every_rank_stops_when_one_rank_sees_a_spike():
    runs = [(SPIKE_ON_RANK_1, True), (SPIKE_ON_RANK_0, True), (NAN_NEXT_TO_A_SPIKE, True), (NAN_NEXT_TO_A_SPIKE, False)]
    for rank, results in enumerate(run_distributed(2, _all_spikes, runs)):
        assert results == [
            ([None, None, None, "spiky"], 4.0),
            ([None, None, "spiky"], 4.0),
            ([None, None, "non-finite"], 4.0),  # the NaN check first
            ([None, None, "spiky"], 4.0),  # without it, rank 0's NaN leaves rank 1's 50.0 to the spike check
        ], rank


def _all_spikes(runs):
    return [_spikes(sequences, nan_check) for sequences, nan_check in runs]
