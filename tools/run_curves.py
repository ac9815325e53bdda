"""The loss curves of one training run, read from the event files its --tensorboard-dir holds.

Pure data: no plotting here (tools/compare_runs.py draws). A run gives
  * its exact parameter counts and architecture line, from the text summary
    `model/parameters (exact)` the trainer writes at startup (the float32 scalars round counts
    above 2^24);
  * training and validation lm loss against tokens and against gigaflos (without embeddings).

TensorBoard steps are integers, so the trainer's `... vs gigaflos (without embeddings)` tags hold
the compute truncated to whole gigaflos: a tiny CPU model moves less than one gigaflo per
iteration. The gigaflos here are C = 6 N D / 1e9 from the exact token count D (the `vs tokens`
step) and the exact non-embedding N (active N for MoE), which is what the trainer accumulates;
each point is checked against the truncated tag, so a run whose accounting differs is refused
rather than drawn on a wrong axis."""
import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: tensorboard is imported when a run is read
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TEXT_TAG = "model/parameters (exact)/text_summary"  # torch's add_text appends /text_summary
TRAIN, VALID = "lm-loss-training/lm loss", "lm-loss-validation/lm loss validation"
AXES = {"samples": " vs samples", "tokens": " vs tokens", "gigaflos": " vs gigaflos (without embeddings)"}


class RunError(ValueError):
    """Bad input: the message is one line naming the run directory and what to do."""


@dataclass
class Curve:
    """Loss points in the order of training; x axes as exact as the event file allows."""
    tokens: list[int] = field(default_factory=list)      # consumed samples x seq length
    gigaflos: list[float] = field(default_factory=list)  # 6 N tokens / 1e9
    loss: list[float] = field(default_factory=list)      # the scalar as stored (float32)


@dataclass
class Run:
    path: str
    name: str
    architecture: str
    parameters: int
    parameters_no_embedding: int
    compute_parameters: int  # the N of C = 6 N D: non-embedding, active ones for MoE
    seq_length: float  # tokens per sample, as the logged counters give it (an int for a real run)
    train: Curve
    valid: Curve


def legend_label(run: Run) -> str:
    return f"{run.name}: {run.architecture}; N = {run.parameters_no_embedding:,} without embeddings"


def event_files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "events.out.tfevents.*")))


def load_run(path: str) -> Run:
    """Run from the --tensorboard-dir `path` of one training run (RunError on bad input)."""
    if not os.path.isdir(path):
        raise RunError(f"{path}: no such directory; pass the --tensorboard-dir of a training run")
    if not event_files(path):
        raise RunError(f"{path}: no TensorBoard event files (events.out.tfevents.*); "
                       "pass the --tensorboard-dir of a training run")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every point
    events.Reload()
    tags = events.Tags()
    counts = _parse_text_summary(path, events, tags)
    for axis in AXES.values():
        if TRAIN + axis not in tags["scalars"]:
            raise RunError(f"{path}: no '{TRAIN + axis}' scalars; train with this trainer's --tensorboard-dir "
                           "for at least one --log-interval")
    seq_lengths, train = _curve(path, events, TRAIN, counts["compute"])
    valid = Curve()
    if VALID + AXES["gigaflos"] in tags["scalars"]:
        more, valid = _curve(path, events, VALID, counts["compute"])
        seq_lengths |= more
    if len(seq_lengths) != 1:
        raise RunError(f"{path}: tokens per sample vary within the run ({sorted(seq_lengths)}); "
                       "compare runs of one --seq-length")
    return Run(path=path, name=os.path.basename(os.path.normpath(path)), architecture=counts["architecture"],
               parameters=counts["total"], parameters_no_embedding=counts["no_embedding"],
               compute_parameters=counts["compute"], seq_length=seq_lengths.pop(), train=train, valid=valid)


def _parse_text_summary(path: str, events: "EventAccumulator", tags: dict[str, Any]) -> dict[str, Any]:
    if TEXT_TAG not in tags["tensors"]:
        raise RunError(f"{path}: no '{TEXT_TAG}' text (the startup report); the run was not written by this trainer")
    text = events.Tensors(TEXT_TAG)[-1].tensor_proto.string_val[0].decode()  # a resumed run wrote it again
    exact = re.search(r"model parameters \(exact\): ([\d,]+) total, ([\d,]+) without embeddings", text)
    arch = re.search(r"architecture: (.+)", text)
    if not (exact and arch):
        raise RunError(f"{path}: the '{TEXT_TAG}' text has no exact counts or architecture line")
    total, no_embedding = (int(g.replace(",", "")) for g in exact.groups())
    active = re.search(r"active parameters per token \(exact\): [\d,]+, ([\d,]+) without embeddings", text)
    compute = int(active.group(1).replace(",", "")) if active else no_embedding  # MoE: C = 6 N_active D
    return {"total": total, "no_embedding": no_embedding, "compute": compute, "architecture": arch.group(1).strip()}


def _curve(path: str, events: "EventAccumulator", tag: str,
           compute_parameters: int) -> tuple[set[int | float], Curve]:
    """Each log call writes the tag vs samples, vs tokens and vs gigaflos in turn, so the i-th
    events of the three belong together. A token count logged twice (a resumed run logging again,
    the end-of-training validation) keeps the last point written."""
    samples, tokens, gigaflos = (events.Scalars(tag + AXES[a]) for a in ("samples", "tokens", "gigaflos"))
    points, seq_lengths = {}, set()
    for s, t, g in zip(samples, tokens, gigaflos, strict=False):  # a run killed mid-log may lack the last triple
        if s.step > 0:
            seq_lengths.add(t.step // s.step if t.step % s.step == 0 else t.step / s.step)
        exact = 6 * compute_parameters * t.step / 1e9
        if abs(exact - g.step) >= 1 + 1e-6 * exact:  # the tag is the trainer's float sum, truncated
            raise RunError(f"{path}: '{tag + AXES['gigaflos']}' step {g.step} is not 6 x N x tokens = {exact:.3f} "
                           f"gigaflos (N = {compute_parameters:,}, tokens = {t.step:,}); cannot place the run on "
                           "a compute axis")
        points[t.step] = (exact, t.value)
    curve = Curve()
    for t in sorted(points):
        curve.tokens.append(t)
        curve.gigaflos.append(points[t][0])
        curve.loss.append(points[t][1])
    return seq_lengths, curve


def check_comparable(runs: Sequence[Run]) -> None:
    """Runs drawn on one compute axis must share the sequence length: C = 6 N D leaves out the
    attention's s^2 term, which differs between sequence lengths."""
    lengths = {run.name: run.seq_length for run in runs}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name}: {seq}" for name, seq in lengths.items())
        raise RunError(f"the runs have different --seq-length ({listed}); compare runs of one sequence length")
