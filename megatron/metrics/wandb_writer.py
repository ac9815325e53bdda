"""Weights & Biases logging (--wandb-project, --wandb-exp-name, --wandb-save-dir: both forks' and
Megatron-LM's flags; --wandb-entity: Megatron-LM's): the TensorBoard scalars, also to W&B. `wandb` is an optional extra
(pip install -e ".[wandb]"); validation refuses the flags in one line without it. WANDB_MODE=offline
writes the run under --wandb-save-dir with no network (`wandb sync` uploads it later)."""
from typing import Any

from megatron.metrics.config import LoggingConfig


class WandbWriter:
    """A SummaryWriter's add_scalar / add_text / close onto one W&B run. W&B has one x axis, the
    step: the scalars against iterations go there; the `... vs samples / tokens / gigaflos` copies
    TensorBoard keeps for other x axes do not (W&B plots any logged scalar against another)."""

    def __init__(self, config: LoggingConfig) -> None:
        import os

        import wandb
        os.makedirs(config.wandb_dir, exist_ok=True)
        self.run = wandb.init(dir=config.wandb_dir, project=config.wandb_project, name=config.wandb_exp_name,
                              entity=config.wandb_entity or None, config=dict(config.wandb_config))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if " vs " not in tag:
            self.run.log({tag: value}, step=step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        self.run.summary[tag] = text  # the startup report and the FLOPs convention, once

    def close(self) -> None:
        import wandb
        self.run.finish()
        wandb.teardown()  # stops wandb's service process: only then is the run file on disk complete


class Writers:
    """Several writers as one (TensorBoard and W&B)."""

    def __init__(self, writers: list[Any]) -> None:
        self.writers = writers

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        for writer in self.writers:
            writer.add_scalar(*args, **kwargs)

    def add_text(self, *args: Any, **kwargs: Any) -> None:
        for writer in self.writers:
            writer.add_text(*args, **kwargs)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
