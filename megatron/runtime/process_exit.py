"""How a run ends its process: one exit code per outcome (docs/long-runs.md#exit-codes), everything
it wrote flushed, then out without interpreter teardown.

Why not a plain return or sys.exit: gloo's worker threads can still be releasing the last
collective's tensors while the interpreter finalises its modules, and the C++ runtime then aborts
the process (`terminate called without an active exception`, exit status 250): after a run that
finished, and after a refusal's one line alike (a damaged checkpoint at 2 ranks under `deepspeed`
ended so about one launch in five). The launcher then reports a failure other than the real one,
and a job scheduler's retry logic reads the wrong outcome. Destroying the process group does not
help (other holders keep the groups alive). Exiting without the teardown does.
"""
import atexit
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

# the outcomes (refused: megatron/runtime/refusal.py's EXIT_CODE, 2; stopped on a non-finite loss or
# gradient norm: pretrain_gpt.py's NON_FINITE_EXIT_CODE, 3)
FINISHED = 0  # the schedule's end, or a stop on purpose after its save (a signal, --exit-interval, ...)
CRASHED = 1  # an unexpected error: its traceback is printed above
INTERRUPTED = 128 + signal.SIGINT  # Ctrl-C where the run had nothing to save (as a shell reports it)


def exit_after_success(code: int = FINISHED) -> NoReturn:
    """Run the registered exit handlers (logging's flush, the --save lock's release, any clean-up a
    library registered), flush stdout / stderr, and end the process with status `code`.
    Checkpoints need nothing here: DeepSpeed's save has written and closed every file before the
    save's final barrier, and the TensorBoard writer was closed by the Trainer that owns it
    (Trainer.finish)."""
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def run_and_exit(main: Callable[[], object], program: str) -> NoReturn:
    """A script's entry point: runs main() and ends the process with its outcome's code, never
    through the interpreter's teardown. sys.exit(n) inside (a refusal's 2, the NaN stop's 3) keeps
    n; an unexpected error prints its traceback and exits CRASHED; Ctrl-C that reached Python
    (before training, or in a run with neither --save nor --exit-signal-handler) is one line."""
    try:
        main()
        code = FINISHED
    except SystemExit as e:  # as the interpreter reads sys.exit's argument
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (FINISHED if e.code is None else CRASHED)
    except KeyboardInterrupt:
        sys.stderr.write(f"{program}: interrupted (SIGINT); nothing saved since the last checkpoint\n")
        code = INTERRUPTED
    except BaseException:
        traceback.print_exc()
        code = CRASHED
    exit_after_success(code)
