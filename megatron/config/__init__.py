"""The run's configuration, in the order a run reads it: the flags (arguments: declarations and
parse_args), their rules (validation), the ds_config reconciled with them (ds_config), and the
frozen result (run_config: RunConfig and its sections). The forks' flags that a launch script may
carry live in two tables: script_flags (accepted with no effect, and why) and fork_features (the
forks' features, implemented or refused in one line).

Nothing is imported here: tools/param_count.py validates flags without torch."""
