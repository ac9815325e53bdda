"""--torch-compile's refusals, whole lines (megatron/config/validation.py)."""
import pytest

from megatron.runtime.refusal import ConfigError
from tests.support.validated_args import validated


@pytest.mark.parametrize("extra, world_size, message", [
    (["--num-experts", "2"], 1, "--torch-compile compiles dense transformer layers only: drop it or --num-experts"),
    (["--ds-sequence-parallel-size", "2", "--no-pipeline-parallel", "--global-batch-size", "4"], 2,
     "--torch-compile does not run with --ds-sequence-parallel-size 2 (DeepSpeed-Ulysses): drop one of them"),
])
def test_refused_combinations(extra, world_size, message):
    with pytest.raises(ConfigError) as refused:
        validated(["--torch-compile", *extra], world_size=world_size)
    assert str(refused.value) == message
    validated(extra, world_size=world_size)  # the same flags run without it


def test_off_by_default_and_on_when_given():
    assert validated().torch_compile is False
    assert validated(["--torch-compile"]).torch_compile is True
