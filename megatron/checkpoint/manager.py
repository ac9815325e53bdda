"""CheckpointManager: save / resume through the DeepSpeed engine, plus our client state.

What --save DIR holds is described in layout.py. A save writes global_stepN whole or not at all
and moves the trackers last (writer.py), so a crash mid-save leaves the previous checkpoint as the
one that loads; a load checks the saved files against their manifest (manifest.py) before the
model is built; one run at a time writes a --save DIR (lock.py), which is checked at startup
(save_dir.py). The manager is handed its section of the run configuration (CheckpointConfig) and
the sections it needs besides (shape, parallel layout, precision); it reads no `args`.
"""
import contextlib
import os
import random
from typing import Any

import numpy as np
import torch

from megatron import mpu, print_rank_0
from megatron.checkpoint.agree import from_rank_0, gather, rank_and_world
from megatron.checkpoint.config import CheckpointConfig, ResumePlan
from megatron.checkpoint.layout import (
    CheckpointLayout,
    read_tracker,
    require_step_dir,
    saved_iterations,
    step_tag,
    write_layout,
    write_model_info,
)
from megatron.checkpoint.lock import release_save_dir
from megatron.checkpoint.manifest import MANIFEST, ManifestError, read_manifest, verify_share
from megatron.checkpoint.reshard import Checkpoint, optimizer_param_names
from megatron.checkpoint.resume import load_resharded, plan_reshard, plan_universal
from megatron.checkpoint.save_dir import checkpoint_bytes, open_save_dir
from megatron.checkpoint.universal import attach_universal_checkpoint_info
from megatron.checkpoint.writer import untrack, write_iteration
from megatron.runtime.refusal import ConfigError
from megatron.runtime.refusal import require as _require
from megatron.schedules.progress import TrainingProgress, saved_progress


def _rng_state() -> dict:
    """Collective under DeepSpeed-Ulysses: DeepSpeed writes one file per TP x PP rank, from the
    first SP rank, so the file carries every SP rank's model-parallel RNG (their dropout masks)."""
    tracker = mpu.get_cuda_rng_tracker().get_states()
    state = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": tracker}
    if mpu.get_sequence_parallel_world_size() > 1:
        per_rank: list = [None] * mpu.get_sequence_parallel_world_size()
        torch.distributed.all_gather_object(per_rank, tracker, group=mpu.get_sequence_parallel_group())
        state["tracker_per_sp_rank"] = per_rank
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Puts back the RNG states load() returned (the caller does it once setup has drawn all it draws).
    Under DeepSpeed-Ulysses each SP rank takes its own model-parallel RNG; saved at another SP size,
    the SP ranks keep the ones --seed gave them (one saved state on every rank would repeat masks)."""
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    sp = mpu.get_sequence_parallel_world_size()
    per_rank = state.get("tracker_per_sp_rank") or [state["tracker"]]
    if len(per_rank) == sp:
        mpu.get_cuda_rng_tracker().set_states(per_rank[mpu.get_sequence_parallel_rank()])


class CheckpointManager:
    """One run's checkpointing: when to save, saving, loading, and the resume plan made before the
    model is built (another layout is resharded, a universal checkpoint converted by DeepSpeed)."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.shape = config.model_shape
        self.parallel = config.parallel
        self.precision = config.precision
        self.zero_stage = config.zero_stage
        self.seq_length = config.seq_length
        self.resume = config.resume
        # the iterations of --save DIR this run's weights came through: those at or below the one it
        # loaded from DIR, then those it saved (what a loss check's stop may untrack: untrack_from)
        self.lineage: list[int] = []

    @property
    def layout(self) -> CheckpointLayout:
        """The layout this run saves (and compares a loaded checkpoint's with)."""
        return CheckpointLayout.from_shape(self.shape, self.parallel.ds_pipeline_enabled)

    def should_save(self, iteration: int) -> bool:
        config = self.config
        return bool(config.save and config.save_interval) and iteration % config.save_interval == 0

    # --- before the model is built ----------------------------------------------------------------

    def plan_resume(self) -> ResumePlan:
        """--load, before the model is built: a checkpoint that does not fit this run fails here in
        one line; one saved at another layout (or a universal one) gives the plan load() follows."""
        config = self.config
        if config.universal_checkpoint:
            return plan_universal(config.load, self.layout, self.shape, self.parallel, self.precision.name,
                                  self.zero_stage)
        iteration = read_tracker(config.load, f"--load {config.load}")
        if iteration is None:
            # the forks' --exit-on-missing-checkpoint (a typo in --load must not train from scratch)
            _require(not config.exit_on_missing_checkpoint,
                     f"--load {config.load}: no checkpoint there (no latest_checkpointed_iteration.txt) and "
                     f"--exit-on-missing-checkpoint is set: fix the path, or drop the flag to start from scratch")
            return ResumePlan()
        return self.check_layout(config.load, iteration)

    def check_layout(self, load_dir: str, iteration: int) -> ResumePlan:
        """Iteration `iteration` of `load_dir` against this run: another shape or precision fails
        here; another TP x PP x DP layout, pipeline split or ZeRO stage is resharded on load. A
        checkpoint written before architecture variants existed reads as a GPT-2."""
        self.verify(load_dir, iteration)
        source = Checkpoint(load_dir, iteration)
        return plan_reshard(source, self.layout, self.config, self.shape, self.parallel, self.precision.name,
                            self.zero_stage)

    def verify(self, load_dir: str, iteration: int) -> None:
        """Every file of global_stepN as its manifest lists it (the ranks share the reading): a
        missing, truncated or altered file, or a file DeepSpeed would read that the checkpoint does
        not have, is one line naming it. A checkpoint saved before manifests existed is not checked
        (said once)."""
        where = f"--load {load_dir}"
        step = require_step_dir(load_dir, iteration, where)
        try:
            manifest = read_manifest(step)
        except ManifestError as e:
            raise ConfigError(f"{where}: {e}") from None
        if manifest is None:
            print_rank_0(f"{where}: {step} has no {MANIFEST} (saved before manifests existed): its files are not "
                         f"verified")
            return
        problems = [p for p in gather(verify_share(step, manifest, *rank_and_world())) if p]
        if problems:  # each names its file
            raise ConfigError(problems[0])

    # --- save -----------------------------------------------------------------------------------

    def open_save_dir(self) -> None:
        """--save, at startup before anything heavy: DIR's lock (global rank 0), a crashed save's
        leftovers removed, and room for one more checkpoint (save_dir.py); a problem is one line on
        every rank. The lock is released by release_save_dir() or at exit."""
        if not self.config.save:
            return
        for line in open_save_dir(self.config.save, self.shape, self.config.memory):
            print_rank_0(line)

    def checkpoint_bytes(self) -> int:
        """The bytes one checkpoint of this run takes, all ranks together (predicted)."""
        return checkpoint_bytes(self.shape, self.config.memory)

    def release_save_dir(self) -> None:
        if self.config.save:
            release_save_dir(self.config.save)

    def save(self, engine: Any, lr_scheduler: Any, progress: TrainingProgress) -> None:
        """Writes global_stepN whole or not at all, then moves the trackers (writer.py): a crash at
        any point leaves the previous checkpoint tracked; a failed write (a full disk) is one line."""
        config, iteration, layout = self.config, progress.iteration, self.layout
        client_state = {
            "iteration": iteration,  # also inside progress; kept at the top for tools that read it
            "progress": progress.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "layout": layout.to_dict(),
            "optimizer_param_names": optimizer_param_names(engine),  # lets another layout resume the optimizer
        }
        if not config.no_save_rng:
            client_state["rng_state"] = _rng_state()
        # so that DeepSpeed's ds_to_universal.py converts it
        attach_universal_checkpoint_info(engine, self.shape, self.parallel.ds_pipeline_enabled)

        def write_shards(tag: str) -> None:
            with self._moe_writers(engine):
                engine.save_checkpoint(config.save, tag=tag, client_state=client_state, save_latest=False)

        def write_ours(directory: str) -> None:
            write_layout(directory, layout)
            write_model_info(directory, self.model_info())

        write_iteration(config.save, iteration, write_shards, write_ours)
        progress.last_saved_iteration = iteration
        self.lineage.append(iteration)
        print_rank_0(f"saved checkpoint at iteration {iteration} to {config.save}")

    def untrack_from(self, first_suspect: int) -> str:
        """After a loss check stopped the run (every rank; rank 0 moves the files): the weights of
        iteration `first_suspect` (the last update before the bad loss) produced it, and every
        checkpoint of the lineage from there on holds them. Those are kept untracked
        (writer.untrack) and the trackers go back to the newest checkpoint of the lineage before
        them. Returns what --save DIR now tracks, for the stop line (the same text on every rank)."""
        save = self.config.save
        if not save:
            return "no --save directory"
        suspects = [n for n in self.lineage if n >= first_suspect]
        keep = max((n for n in self.lineage if n < first_suspect), default=None)
        where = None
        if self.parallel.rank == 0:
            try:
                where = self._untrack(save, suspects, keep)
            except ConfigError as e:  # a garbled tracker: said, and every rank still leaves together
                where = str(e)
        return from_rank_0(where)

    def _untrack(self, save: str, suspects: list[int], keep: int | None) -> str:
        if not suspects:
            tracked = read_tracker(save, f"--save {save}")
            return (f"--save {save}: " + (f"{step_tag(tracked)} stays the tracked checkpoint" if tracked is not None
                                          else "no checkpoint is tracked"))
        held = ", ".join(map(step_tag, suspects))
        try:
            renamed = untrack(save, suspects, keep)
        except OSError as e:  # the stop goes on: say what is left to do by hand
            return (f"--save {save}: {held} held the weights that produced it, but untracking them failed "
                    f"({type(e).__name__}: {e}); point the trackers at an earlier iteration by hand")
        now = (f"{step_tag(keep)} is the tracked checkpoint" if keep is not None
               else "no earlier checkpoint of this run is left: the trackers are removed")
        return f"--save {save}: {held} held the weights that produced it, kept untracked as {', '.join(renamed)}; {now}"

    def model_info(self) -> dict:
        """megatron_model.json: what a tool needs besides the layout to rebuild or export the model."""
        return {"vocab_size": self.shape.vocab_size, "seq_length": self.seq_length,
                "make_vocab_size_divisible_by": self.shape.make_vocab_size_divisible_by, **self.config.model_info}

    def _moe_writers(self, engine: Any) -> Any:
        if not self.shape.is_moe:
            return contextlib.nullcontext()
        from megatron.model.moe import every_tp_rank_writes_its_files
        return every_tp_rank_writes_its_files(engine)

    # --- load -----------------------------------------------------------------------------------

    def load(self, engine: Any, lr_scheduler: Any, progress: TrainingProgress) -> dict | None:
        """Restores the weights (and optimizer, LR schedule and `progress` unless --finetune) and
        returns the saved RNG state or None. The caller restores the RNG state (set_rng_state) once
        everything that draws from the RNG during setup has run."""
        config, load_dir = self.config, self.config.load
        iteration = None if config.universal_checkpoint else read_tracker(load_dir, f"--load {load_dir}")
        if config.universal_checkpoint:  # DeepSpeed cuts TP slices and DP partitions from DIR/<tag>/zero
            path, client_state = engine.load_checkpoint(load_dir, tag=self.resume.universal_tag,
                                                        load_lr_scheduler_states=False,
                                                        load_optimizer_states=config.load_optimizer)
        elif iteration is None:
            print_rank_0(f"WARNING: no checkpoint found in --load {load_dir}; starting from scratch")
            return None
        elif self.resume.reshard_source:  # saved at another TP x PP layout (see check_layout)
            source = Checkpoint(*self.resume.reshard_source)
            path, client_state = load_resharded(engine, source, config, self.shape,
                                                self.parallel.ds_pipeline_enabled, self.precision.fp16)
        else:
            path, client_state = engine.load_checkpoint(load_dir, tag=step_tag(iteration),
                                                        load_optimizer_states=config.load_optimizer,
                                                        load_lr_scheduler_states=False)
        if path is None:
            raise ConfigError(f"--load {load_dir}: DeepSpeed could not load {step_tag(iteration)}")
        if config.universal_checkpoint:
            client_state.pop("rng_state", None)  # another layout's: the run reseeds from --seed
        if config.finetune:
            print_rank_0(f"loaded weights from {path} (finetune: counters and optimizer reset)")
            return None
        saved = saved_progress(client_state)
        progress.load_state_dict(saved)
        if "consumed_train_tokens" not in saved:  # written before tokens were counted
            progress.consumed_train_tokens = progress.consumed_train_samples * self.seq_length
        # saved already only where this run saves: resumed from --load A with --save B, a run that
        # ends (or exits) at once still writes its iteration into B
        same_dir = bool(config.save) and os.path.realpath(config.save) == os.path.realpath(load_dir)
        progress.last_saved_iteration = progress.iteration if same_dir else None
        if same_dir:
            self.lineage = [n for n in saved_iterations(load_dir) if n <= progress.iteration]
        lr_scheduler.load_state_dict(client_state["lr_scheduler"])
        print_rank_0(f"loaded checkpoint {path} at iteration {progress.iteration}")
        return None if config.no_load_rng else client_state.get("rng_state")
