"""--exit-duration-in-mins is decided together: when one rank's clock passes the limit every rank
stops after the same iteration (otherwise one rank would enter the exit save and its barrier
while the others start another step, and the run would hang)."""
import argparse
import time

from distributed import run_distributed


def _decide(cases):
    """Each case: minutes since each rank's start; returns each case's decision on this rank."""
    import torch.distributed as dist

    from megatron.training import _out_of_time
    args = argparse.Namespace(exit_duration_in_mins=1)
    return [_out_of_time(time.time() - 60 * minutes[dist.get_rank()], args) for minutes in cases]


def test_one_late_rank_stops_every_rank():
    # rank 0 past the limit; rank 1 past it; neither
    assert run_distributed(2, _decide, [[2, 0], [0, 1.5], [0, 0.5]]) == [[True, True, False]] * 2
