"""The run's progress: what a checkpoint must carry for training to continue where it stopped.
Saved and restored as one entry, so adding a field is one line."""
from dataclasses import asdict, dataclass, fields


@dataclass
class TrainingProgress:
    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    consumed_train_tokens: int = 0    # samples x the length trained (--seq-length or a curriculum's)
    gigaflos_no_embeds: float = 0.0   # C = 6 N D so far (N without embeddings), in 1e9 FLOPs
    # the model's FLOPs so far (no recompute; the cached FLOPs per sample x samples, at each iteration's
    # length): Megatron-LM's num_floating_point_operations_so_far, what --log-progress writes
    floating_point_operations: int = 0
    skipped_iterations: int = 0       # fp16 steps whose update was skipped (gradient overflow)
    last_saved_iteration: int | None = None
    # --check-for-spiky-loss's reference (megatron/training/loss_check.py): how many of the run's
    # first losses it has seen (up to 100) and the largest |loss| among them
    spiky_loss_samples: int = 0
    spiky_loss_max: float = 0.0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Fields missing from an older checkpoint keep their defaults."""
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, state[f.name])


def saved_progress(client_state: dict) -> dict:
    """The progress entry of a checkpoint's client state; checkpoints written before it existed
    kept these fields at the top level."""
    if "progress" in client_state:
        return client_state["progress"]
    return {name: client_state[name] for name in ("iteration", "consumed_train_samples", "consumed_valid_samples",
                                                  "gigaflos_no_embeds") if name in client_state}
