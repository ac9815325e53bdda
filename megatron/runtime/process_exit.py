"""How a finished run ends its process: everything it wrote flushed, then out without interpreter
teardown, so a run that printed its last iteration exits 0.

Why not a plain return: gloo's worker threads can still be releasing the last collective's
tensors while the interpreter finalises its modules, and the C++ runtime then aborts the process
(`terminate called without an active exception`, exit status 250) after the run has finished; the
launcher reports a failure and a job scheduler would retry a finished run. Destroying the process
group does not help (other holders keep the groups alive). Exiting without the teardown does.

Only a run that returned normally comes here: an exception still unwinds through the interpreter
and exits non-zero, a configuration error through sys.exit(2).
"""
import atexit
import logging
import os
import sys
from typing import NoReturn


def exit_after_success(code: int = 0) -> NoReturn:
    """Run the registered exit handlers (logging's flush and any clean-up a library registered),
    flush stdout / stderr, and end the process with status `code` (0; a run stopped on purpose after
    training, e.g. on a NaN, passes its own code so that teardown cannot turn it into 250).
    Checkpoints need nothing here: DeepSpeed's save has written and closed every file before the
    save's final barrier, and the TensorBoard writer was closed by the Trainer that owns it
    (Trainer.finish)."""
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
