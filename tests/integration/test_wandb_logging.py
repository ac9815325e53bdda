"""W&B logging with the forks' flags (--wandb-project / --wandb-exp-name / --wandb-save-dir): an
offline run (WANDB_MODE=offline, no network) holds the same scalars as the run's TensorBoard, each
tag against iterations at the same steps, read back from the run file wandb's own service wrote
(tests/support/wandb_offline.py); the refusals are one line each."""
import sys

import pytest

from megatron.runtime.refusal import ConfigError
from tests.support.launcher import TINY
from tests.support.validated_args import validated
from tests.support.wandb_offline import offline_run


def test_offline_run_holds_the_tensorboard_scalars(entry_point, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import pretrain_gpt
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tb, wb = tmp_path / "tb", tmp_path / "wb"
    pretrain_gpt.main([str(f) for f in TINY + [
        "--global-batch-size", 2, "--train-iters", 3, "--eval-interval", 2, "--tensorboard-dir", tb,
        "--log-timers-to-tensorboard", "--wandb-project", "proj", "--wandb-exp-name", "tiny", "--wandb-save-dir", wb,
        "--wandb-entity", "a-team"]])
    events = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    events.Reload()
    board = {}
    for tag in events.Tags()["scalars"]:
        if " vs " not in tag:  # the copies against samples / tokens / gigaflos stay in TensorBoard
            for event in events.Scalars(tag):
                board.setdefault(event.step, {})[tag] = event.value
    name, project, history, entity = offline_run(str(wb))
    assert (name, project, entity) == ("tiny", "proj", "a-team")
    assert sorted(history) == sorted(board) == [0, 1, 2, 3]
    assert "lm-loss-training/lm loss" in board[3] and "lm-loss-validation/lm loss validation" in board[2]
    for step, scalars in board.items():
        assert sorted(history[step]) == sorted(scalars), step
        for tag, value in scalars.items():  # TensorBoard keeps float32
            assert history[step][tag] == pytest.approx(value, rel=1e-6), (step, tag)


@pytest.mark.parametrize("extra, line", [
    (["--wandb-project", "p"], "--wandb-project p needs --wandb-exp-name NAME (the run's name)"),
    (["--wandb-project", "p", "--wandb-exp-name", "e"],
     "--wandb-project writes its files into --wandb-save-dir (default --save/wandb): give one of them"),
])
def test_refusals(extra, line):
    with pytest.raises(ConfigError) as e:
        validated(extra)
    assert str(e.value) == line


def test_without_wandb_installed_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: importing it fails
    with pytest.raises(ConfigError) as e:
        validated(["--wandb-project", "p", "--wandb-exp-name", "e", "--wandb-save-dir", tmp_path])
    assert str(e.value) == ("--wandb-project needs the wandb package: pip install -e '.[wandb]' "
                            "(or drop --wandb-project)")
