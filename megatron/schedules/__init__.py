"""What changes from iteration to iteration, as arithmetic on the progress counters: the learning
rate (learning_rates: AnnealingLR), the global batch size's ramp-up (microbatches), the
sequence-length curriculum (curriculum), skipped iteration ranges (skip_iterations), and the
training progress record those read and checkpoints save (progress: TrainingProgress).

Nothing is imported here: tools/param_count.py reads the schedules without torch."""
