"""What every layer below the components needs and nothing else: a refused run's one line and exit
code (refusal: ConfigError and the require helpers), the exit codes of the other outcomes
(process_exit), log levels, the globals behind get_args(), atomic file writes, the parallel layout
and precision as frozen values, and the one adapter of DeepSpeed's private attributes
(deepspeed_internals).

Nothing is imported here, and nothing here imports torch at module level: tools/param_count.py
validates flags without it."""
