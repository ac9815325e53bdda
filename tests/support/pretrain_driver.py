"""Runs pretrain_gpt.py's main() under `deepspeed`, watched through the Trainer's hooks
(megatron.training.TrainerHooks) for the tests, and writes what each rank saw to
$DRIVER_OUT/rank{R}.json:

  * DeepSpeed's own engine view (its UNIQUE_PARAMS log line, made visible at INFO level);
  * our cached counts from args;
  * spies: torch.distributed collectives and Module.parameters()/named_parameters() calls made
    while the log line is written (between the Trainer's on_log_start and on_log_end hooks: the
    call of megatron.metrics.training_log.training_log), and how often the count itself ran;
  * with DRIVER_INF_GRAD_AT=N: iteration N's gradients are made infinite (a forced overflow, as an
    fp16 loss scale that is too high produces), for the engine's own overflow check to catch;
  * each logged iteration's learning rate and consumed tokens, and each evaluation's (prefix, group
    name, loss), at full precision;
  * with DRIVER_KILL_SWITCH_AT=N: rank 0 alone creates the --kill-switch-path file right after
    iteration N's log call (the other ranks may look before it exists: they must still stop together);
  * with DRIVER_RECORD_BATCHES=1: the distinct token ids of every sample each rank's batch function
    received (the data actually drawn), in order;
  * with DRIVER_DUMP_LOADED=1: right after --load, every parameter's weights, fp32 master and Adam
    moments as DeepSpeed's own API gathers them over DP (safe_get_full_*), in rank{R}_loaded.pt;
  * each iteration's own loss as the engine returned it (`step_losses`), before any averaging;
  * with DRIVER_DIE_IN_SAVE=N:R: rank R kills itself (SIGKILL, as a node loss or the OOM killer does)
    right after writing its ZeRO optimizer file of iteration N's save, mid-save;
  * with DRIVER_HOLD_UNTIL=PATH: every rank waits, once the engine is built (the run holds its
    --save directory by then), until PATH exists (a test does something meanwhile), having written
    $DRIVER_OUT/rank{R}.held;
  * each forward of the model on this rank: (training, the sequence length of its [b, s] token
    input) where the rank's model takes tokens (`model_inputs`; the first pipeline stage, or all);
  * `stop_flags`: after each iteration (and once before the first, with --exit-duration-in-mins),
    [iteration, late, used, longest iteration, save] as the ranks agreed on them (the Trainer's
    on_stop_flags hook); `step_times`: each iteration's [start, end] wall-clock time around the
    engine's step (on_step_start / on_step_end); `process_start`: this process's start, read from
    /proc by hand (the boot time plus its start ticks), not through the trainer's code;
  * with DRIVER_PAUSE_AT=N: at the start of iteration N each rank writes $DRIVER_OUT/rank{R}.paused
    (its PID and its parent's) and waits until $DRIVER_OUT/go exists, so that a test can signal
    processes while every rank is known to be inside iteration N; meanwhile, once the rank's stop
    signal handler has something (a signal, its launcher gone), it writes $DRIVER_OUT/rank{R}.received
    (the test lets the ranks go once the signals it sent have landed);
  * `exit_signal`: what the rank's stop signal handler holds at the end (its first signal), or None.
  * with DRIVER_SCALE_WEIGHTS_AT=N:F: right after iteration N's step (before anything of it is
    saved) every rank multiplies its weights by F in place: a blow-up at a known iteration, that
    iteration N+1's loss shows;
  * with DRIVER_SPIKY_SAMPLES=S: --check-for-spiky-loss's reference is the largest of the first S
    losses instead of 100 (Trainer.spiky_loss_samples), so that a short run can spike;
  * with DRIVER_SLOW_RANK=R:S: rank R sleeps S seconds at the end of each of its training steps,
    inside the timed iteration and after the step's last collective (a straggler, for
    --timing-log-option to name); its `step_times` include the sleep;
  * a run stopped by a loss check (pretrain_gpt.py's exit code 3) still writes its rank{R}.json:
    what the hooks recorded, and `stopped` (the code).
"""
import json
import logging
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist
from deepspeed.utils import logger as ds_logger

import pretrain_gpt
from megatron.training import TrainerHooks

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "barrier", "send", "recv", "isend", "irecv", "all_to_all_single")
state = {"in_log": False, "collectives_in_log": 0, "parameter_walks_in_log": 0, "log_calls": 0,
         "count_calls": 0, "ds_unique": None, "ds_total": None, "losses": {}, "lrs": {}, "tokens": {},
         "samples": [], "evaluations": [], "step_losses": {}, "model_inputs": [], "stop_flags": [],
         "step_times": {}, "weight_decays": {}}


def _process_start_by_hand():
    """time.time() of this process's start: /proc/stat's boot time plus field 22 of /proc/self/stat."""
    with open("/proc/stat") as f:
        booted = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def _spy(owner, name, counter):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if state["in_log"]:
            state[counter] += 1
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)


for name in COLLECTIVES:
    if hasattr(dist, name):
        _spy(dist, name, "collectives_in_log")
_spy(torch.nn.Module, "parameters", "parameter_walks_in_log")
_spy(torch.nn.Module, "named_parameters", "parameter_walks_in_log")


class Recorder(TrainerHooks):
    """Records through the Trainer's documented hooks (megatron/training/trainer.py, TrainerHooks)."""

    def on_parameter_counts(self, trainer, counts):
        state["count_calls"] += 1

    def on_build(self, trainer):
        """What the engine really runs with: its ZeRO stage and the elements this rank holds after it
        partitioned the model (ZeRO-3 leaves each rank its shard only)."""
        self.trainer = trainer
        engine = trainer.engine
        state["zero_stage"] = engine.zero_optimization_stage()
        state["engine_local_numel"] = sum(getattr(p, "ds_tensor", p).numel() for p in engine.module.parameters())
        # the ZeRO settings DeepSpeed parsed, and the default process group's timeout (--zero-*,
        # --distributed-timeout-minutes)
        zero = engine._config.zero_config
        state["zero_config"] = {key: getattr(zero, key) for key in ("reduce_scatter", "contiguous_gradients",
                                                                    "reduce_bucket_size", "allgather_bucket_size")}
        from megatron import mpu
        state["pg_timeout_s"] = {name: group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                                 for name, group in (("default", dist.distributed_c10d._get_default_group()),
                                                     ("tp", mpu.get_tensor_model_parallel_group()),
                                                     ("dp", mpu.get_data_parallel_group()))}

        def record_input(module, inputs):
            tokens = inputs[0] if inputs else None
            if isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and not tokens.is_floating_point():
                state["model_inputs"].append([module.training, tokens.size(1)])
        engine.module.register_forward_pre_hook(record_input)
        if os.environ.get("DRIVER_SPIKY_SAMPLES"):
            trainer.spiky_loss_samples = int(os.environ["DRIVER_SPIKY_SAMPLES"])
        hold = os.environ.get("DRIVER_HOLD_UNTIL")
        if hold:  # past every startup check: a test may now change what the run will meet
            open(os.path.join(os.environ["DRIVER_OUT"], f"rank{trainer.args.rank}.held"), "w").close()
        while hold and not os.path.exists(hold):
            time.sleep(0.1)

    def on_load(self, trainer):
        if os.environ.get("DRIVER_DUMP_LOADED"):
            from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
            engine = trainer.engine
            dump = {name: {"weight": p.detach().clone(), "fp32": safe_get_full_fp32_param(p),
                           **{k: safe_get_full_optimizer_state(p, k) for k in ("exp_avg", "exp_avg_sq")}}
                    for name, p in engine.module.named_parameters()}
            steps = [s["step"] for s in engine.optimizer.optimizer.state.values()]
            torch.save({"params": dump, "steps": steps, "iteration": trainer.progress.iteration},
                       os.path.join(os.environ["DRIVER_OUT"], f"rank{trainer.args.rank}_loaded.pt"))

    def on_batch(self, trainer, data):
        if os.environ.get("DRIVER_RECORD_BATCHES"):
            state["samples"] += [sorted(set(row.tolist())) for row in data["text"]]

    def on_step_start(self, trainer):
        self.inf_hook = None
        state["step_times"][trainer.progress.iteration + 1] = [time.time(), None]
        if trainer.progress.iteration + 1 == int(os.environ.get("DRIVER_PAUSE_AT", "0")):
            _pause(trainer)
        if trainer.progress.iteration + 1 == int(os.environ.get("DRIVER_INF_GRAD_AT", "0")):
            param = next(trainer.engine.module.parameters())
            self.inf_hook = param.register_hook(lambda grad: torch.full_like(grad, float("inf")))

    def on_step_end(self, trainer, loss):
        """Also records each iteration's own loss, as the engine returned it (`step_losses`)."""
        if self.inf_hook is not None:
            self.inf_hook.remove()
        state["step_losses"][trainer.progress.iteration] = float(loss)
        # each optimizer group's weight decay after the step (--weight-decay-incr-style)
        state["weight_decays"][trainer.progress.iteration] = [g["weight_decay"]
                                                              for g in trainer.engine.optimizer.param_groups]
        at, _, factor = os.environ.get("DRIVER_SCALE_WEIGHTS_AT", "0:1").partition(":")
        if trainer.progress.iteration == int(at):
            with torch.no_grad():
                for param in trainer.engine.module.parameters():
                    param.mul_(float(factor))
        slow_rank, _, seconds = os.environ.get("DRIVER_SLOW_RANK", "-1:0").partition(":")
        if trainer.args.rank == int(slow_rank):
            time.sleep(float(seconds))
        state["step_times"][trainer.progress.iteration][1] = time.time()

    def on_log_start(self, trainer, stats, lr):
        # the logged loss at full precision, for bit-for-bit comparisons across runs
        progress = trainer.progress
        state["losses"][progress.iteration] = stats.mean_loss()
        state["lrs"][progress.iteration] = lr
        state["tokens"][progress.iteration] = progress.consumed_train_tokens
        state["log_calls"] += 1
        state["in_log"] = True

    def on_log_end(self, trainer):
        state["in_log"] = False
        if trainer.progress.iteration == int(os.environ.get("DRIVER_KILL_SWITCH_AT", "0")) and trainer.args.rank == 0:
            open(trainer.args.kill_switch_path, "w").close()

    def on_evaluate(self, trainer, prefix, name, loss):
        state["evaluations"].append([prefix, name, loss])  # at full precision

    def on_stop_flags(self, trainer, flags):
        state["stop_flags"].append([trainer.progress.iteration, flags.late, *(flags.times or ())])


RECORDER = Recorder()


def _write_whole(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)  # whole, for the test that polls for it


def _pause(trainer):
    """DRIVER_PAUSE_AT: rank{R}.paused, then wait for the test's `go` (writing rank{R}.received once
    the stop signal handler has something)."""
    out, rank = os.environ["DRIVER_OUT"], trainer.args.rank
    _write_whole(os.path.join(out, f"rank{rank}.paused"), json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
    noted = False
    while not os.path.exists(os.path.join(out, "go")):
        received = trainer.exit_signal.received if trainer.exit_signal is not None else None
        if received is not None and not noted:
            _write_whole(os.path.join(out, f"rank{rank}.received"), received)
            noted = True
        time.sleep(0.02)


def run(argv):
    """pretrain_gpt.main(argv), recorded into `state` (tests that run it in-process call this)."""
    return pretrain_gpt.main(argv, hooks=RECORDER)


class _EngineView(logging.Handler):
    def emit(self, record):
        match = re.search(r"TOTAL_PARAMS=(\d+).*UNIQUE_PARAMS=(\d+)", record.getMessage())
        if match:
            state["ds_total"], state["ds_unique"] = int(match.group(1)), int(match.group(2))


def _die_in_save(iteration, rank):
    """torch.save, as DeepSpeed's checkpoint engine calls it, with a SIGKILL after rank `rank` has
    written its ZeRO file of iteration `iteration`'s save."""
    save = torch.save

    def save_then_die(obj, f, *args, **kwargs):
        result = save(obj, f, *args, **kwargs)
        if (isinstance(f, str) and f"global_step{iteration}" in f and "zero_pp_rank_" in os.path.basename(f)
                and dist.get_rank() == rank):
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    torch.save = save_then_die


if os.environ.get("DRIVER_DIE_IN_SAVE"):
    _die_in_save(*map(int, os.environ["DRIVER_DIE_IN_SAVE"].split(":")))


ds_logger.setLevel(logging.INFO)
ds_logger.addHandler(_EngineView(level=logging.INFO))


def _exit_signal():
    handler = RECORDER.trainer.exit_signal if hasattr(RECORDER, "trainer") else None
    return handler.received if handler is not None else None


def main():
    out = os.environ["DRIVER_OUT"]
    try:
        args, progress = run(sys.argv[1:])
    except SystemExit as e:
        if e.code == pretrain_gpt.NON_FINITE_EXIT_CODE:  # a loss check's stop: what the hooks saw so far
            with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
                json.dump(dict(state, stopped=e.code, in_log=None), f)
        raise
    result = dict(state, rank=args.rank, process_start=_process_start_by_hand(), parameters=args.parameters,
                  parameters_no_embedding=args.parameters_no_embedding,
                  parameters_in_billions=args.parameters_in_billions,
                  parameters_in_billions_no_embedding=args.parameters_in_billions_no_embedding,
                  parameters_active=args.parameters_active,
                  parameters_active_no_embedding=args.parameters_active_no_embedding,
                  components=args.parameter_components, stages=args.parameter_stages,
                  flops_per_sample=args.flops_per_sample, padded_vocab_size=args.padded_vocab_size,
                  iteration=progress.iteration, gigaflos_no_embeds=progress.gigaflos_no_embeds,
                  consumed_valid_samples=progress.consumed_valid_samples, exit_signal=_exit_signal())
    del result["in_log"]
    with open(os.path.join(out, f"rank{args.rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    # as pretrain_gpt.py's own entry point: each outcome its exit code, without interpreter teardown
    from megatron.runtime.process_exit import run_and_exit
    run_and_exit(main, "pretrain_driver.py")
