"""The metrics component: the log line and TensorBoard scalars (training_log), the writer's owner
(processor: MetricsProcessor, built from the run configuration's LoggingConfig, config), MFU (mfu),
the memory prediction (memory) and its measurement (memory_measure), gradient statistics
(grad_stats) and optimizer-state norms (optimizer_states).

Nothing is imported here: tools/param_count.py reads memory, config and mfu without torch."""
