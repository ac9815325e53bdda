"""Launch real multi-process training runs the way users do: `deepspeed --num_gpus N ...`."""
import json
import os

from tests.support.launch import ROOT, logged_iterations, run_deepspeed

DRIVER = os.path.join(ROOT, "tests", "support", "pretrain_driver.py")

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--lr", "3e-3", "--lr-warmup-iters", "1",
        "--mock-data", "--vocab-size", "600", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1", "--seed", "1234"]


def launch(num_ranks, args, out_dir, script=DRIVER, timeout=600, check=True):
    """Returns (completed process, {rank: driver json}) ; stdout+stderr in proc.stdout."""
    os.makedirs(out_dir, exist_ok=True)
    proc = run_deepspeed(num_ranks, script, args, env=dict(os.environ, DRIVER_OUT=out_dir), timeout=timeout, fork=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"run failed ({proc.returncode}):\n{proc.stdout[-6000:]}")
    ranks = {}
    for r in range(num_ranks):
        path = os.path.join(out_dir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks[r] = json.load(f)
    return proc, ranks


def losses(output):
    """{iteration: lm loss} from the Megatron log lines."""
    return {it: fields["lm loss"] for it, fields in logged_iterations(output).items()}
