"""Run flags of both forks, through real launches (2 ranks, DP 2, ZeRO 1):
- --zero-reduce-bucket-size / --zero-allgather-bucket-size / --zero-reduce-scatter /
  --zero-contigious-gradients reach the ZeRO config DeepSpeed parsed (the engine's own);
- --distributed-timeout-minutes 7 is the timeout of the default process group and of our TP and DP
  groups (a new group does not inherit the default group's: Megatron-LM gives it to each), 420 s;
- --weight-decay-incr-style linear from 0 to 0.12 over the run's 6 x 4 = 24 samples: after
  iteration k the decayed group holds 0.12 x 4k / 24 = 0.02 k (the biases and norms 0), also
  after a save at iteration 3 and a resume from it (the schedule's state in the checkpoint);
- --exit-on-missing-checkpoint with a --load that holds no checkpoint: exit 2, one line, no
  training; with one there it resumes."""
import pytest

from megatron.runtime.refusal import ConfigError
from tests.support.launcher import TINY, launch
from tests.support.validated_args import validated

ZERO = ["--zero-stage", "1", "--zero-reduce-scatter", "--zero-contigious-gradients",
        "--zero-reduce-bucket-size", "123456", "--zero-allgather-bucket-size", "234566"]
FLAGS = TINY + ["--global-batch-size", "4", "--train-iters", "6", "--distributed-timeout-minutes", "7",
                "--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay", "0.12",
                "--save-interval", "3", "--exit-on-missing-checkpoint"] + ZERO


def test_zero_flags_timeout_weight_decay_and_resume(tmp_path):
    save = str(tmp_path / "ckpt")
    _, ranks = launch(2, FLAGS + ["--save", save, "--exit-interval", "3"], str(tmp_path / "first"))
    _, resumed = launch(2, FLAGS + ["--save", save, "--load", save], str(tmp_path / "second"))
    for rank in (ranks[0], ranks[1], resumed[0]):
        assert rank["zero_config"] == {"reduce_scatter": True, "contiguous_gradients": True,
                                       "reduce_bucket_size": 123456, "allgather_bucket_size": 234566}
        assert rank["pg_timeout_s"] == {"default": 420.0, "tp": 420.0, "dp": 420.0}
    decays = {int(k): v for k, v in ranks[0]["weight_decays"].items()}
    decays.update({int(k): v for k, v in resumed[0]["weight_decays"].items()})
    assert sorted(decays) == [1, 2, 3, 4, 5, 6] and sorted(resumed[0]["weight_decays"], key=int) == ["4", "5", "6"]
    for it, groups in decays.items():
        assert groups == [pytest.approx(0.02 * it), 0.0], it


def test_exit_on_missing_checkpoint(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    proc, ranks = launch(1, TINY + ["--global-batch-size", "2", "--train-iters", "2", "--load", str(empty),
                                    "--exit-on-missing-checkpoint"], str(tmp_path / "out"), check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert proc.stdout.count("--exit-on-missing-checkpoint is set") == 1
    assert " iteration " not in proc.stdout and not ranks


def test_zero_flags_against_a_given_ds_config(tmp_path):
    """Without a ds_config the flags fill zero_optimization; a given one that says otherwise is one
    line; a flag at its default (0, off) leaves the ds_config's value alone."""
    built = validated(ZERO).deepspeed_config_dict["zero_optimization"]
    assert built == {"stage": 1, "reduce_scatter": True, "contiguous_gradients": True,
                     "reduce_bucket_size": 123456, "allgather_bucket_size": 234566}
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 1, "contiguous_gradients": false, '
                      '"reduce_bucket_size": 5000}}')
    kept = validated(["--deepspeed_config", str(config)]).deepspeed_config_dict["zero_optimization"]
    assert kept["reduce_bucket_size"] == 5000 and kept["contiguous_gradients"] is False
    for flag in (["--zero-contigious-gradients"], ["--zero-reduce-bucket-size", "6000"]):
        with pytest.raises(ConfigError, match="disagrees with " + flag[0]):
            validated(["--deepspeed_config", str(config)] + flag)
    # DeepSpeed's engine would assert on an odd gather bucket: one line first
    with pytest.raises(ConfigError, match="allgather_bucket_size 2001 .* must be a multiple of 2"):
        validated(["--zero-allgather-bucket-size", "2001"])
