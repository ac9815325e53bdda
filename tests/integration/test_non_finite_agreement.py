"""--check-for-nan-in-loss-and-grad decides on every rank together (Trainer.non_finite: one MAX
all-reduce over gloo): a loss that is not finite on one rank only (each DP rank has its own loss
under --no-pipeline-parallel), a gradient norm that is not finite on one rank only, stop every rank;
a step the engine skipped (the loss scaler's overflow) and a step without a computed norm are
judged by what they have. Two real ranks; each rank's engine is the two answers the check asks a
DeepSpeed engine for (whether the step was applied, the cached global gradient norm), given per
case, so that one rank alone can be made non-finite -- the all-reduce and the decision are the
trainer's own. Real runs that go non-finite are in tests/integration/test_exit_signal.py."""
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


def _decide(cases):
    import torch

    from megatron.training.trainer import Trainer
    rank = torch.distributed.get_rank()
    decided = []
    for case in cases:
        loss, applied, grad_norm = case[rank]
        trainer = SimpleNamespace(engine=_Answers(applied, grad_norm))
        decided.append(Trainer.non_finite(trainer, torch.tensor(loss)))
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
