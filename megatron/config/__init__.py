"""The run's configuration, in the order a run reads it: the flags (arguments: declarations and
parse_args), their rules (validation), the ds_config reconciled with them (ds_config), and the
frozen result (run_config: RunConfig and its sections). Every flag of the forks' GPT pretraining
path is a row of flag_table (implemented, accepted with no effect, refused in one line, or another
model's); script_flags (the startup line naming the no-effect ones) and fork_features (the refusals,
the recompute spellings) read it.

Nothing is imported here: tools/param_count.py validates flags without torch."""
