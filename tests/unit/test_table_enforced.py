"""The parameter table is enforced at build: a built model that differs from it stops the run
before training, in one line naming the component, both numbers and the flag combination (the
FLOPs, memory and export that follow from the table would otherwise describe another model).

Through pretrain_gpt.py's entry point in-process (a world of one), with a model provider that
builds something other than the flags say, as a user's own provider could."""
import dataclasses

import pytest
import torch

import pretrain_gpt
from tests.support.launch import free_port

H, LAYERS = 64, 4
FLAGS = ["--num-layers", LAYERS, "--hidden-size", H, "--num-attention-heads", 4, "--seq-length", 32,
         "--max-position-embeddings", 32, "--micro-batch-size", 2, "--global-batch-size", 2, "--train-iters", 2,
         "--lr", "1e-3", "--mock-data", "--vocab-size", 600, "--no-pipeline-parallel", "--swiglu"]


@pytest.fixture
def run_with_provider(monkeypatch, capsys):
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)

    def run(change):
        """change(model_shape) -> the shape the provider really builds; or a model post-processor."""
        def provider(args):
            from megatron.model.config import GPTConfig
            from megatron.model.gpt_model import GPTModel
            config = GPTConfig.from_args(args)
            if "shape" in change:
                config = dataclasses.replace(config, shape=change["shape"](args.model_shape))
            model = GPTModel(config, seed=args.seed)
            if "model" in change:
                change["model"](model)
            return model
        monkeypatch.setattr(pretrain_gpt, "model_provider", provider)
        with pytest.raises(SystemExit) as exit_info:
            pretrain_gpt.main([str(f) for f in FLAGS])
        out, err = capsys.readouterr()
        assert exit_info.value.code == 2 and "Traceback" not in out + err
        assert " iteration " not in out  # stopped before training
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pretrain_gpt.py: error: "), lines
        return lines[0]

    yield run
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_count_that_differs_stops_the_run(run_with_provider):
    # the provider builds every linear without its bias while the flags keep them
    line = run_with_provider({"shape": lambda shape: dataclasses.replace(shape, add_bias_linear=False)})
    # by hand, 4 layers at h 64 (--swiglu: ffn int(8 x 64 / 3 / 64) x 64 = 128): attention QKV 3h x h
    # and dense h x h with biases 3h + h; MLP 2 x 128 x h and h x 128 with biases 256 + h
    attention, mlp = 4 * H * H, 2 * 128 * H + H * 128
    assert f"attention: counted {LAYERS * attention:,}, formula {LAYERS * (attention + 4 * H):,}" in line
    assert f"mlp: counted {LAYERS * mlp:,}, formula {LAYERS * (mlp + 256 + H):,}" in line
    assert f"num_layers={LAYERS} hidden_size={H}" in line and "glu_activation=swiglu" in line


def test_a_shape_that_differs_stops_the_run(run_with_provider):
    line = run_with_provider({"shape": lambda shape: dataclasses.replace(shape, ffn_hidden_size=192)})
    assert ("mlp: the built language_model.encoder.layers.0.mlp.dense_h_to_4h.weight has shape (384, 64), "
            "the parameter table (256, 64)") in line
    assert "ffn_hidden_size=128" in line


def test_a_parameter_the_table_lacks_stops_the_run(run_with_provider):
    def add_scale(model):
        model.language_model.encoder.layers[1].self_attention.scale = torch.nn.Parameter(torch.ones(4))
    line = run_with_provider({"model": add_scale})
    assert "language_model.encoder.layers.1.self_attention.scale (4,)" in line
    assert "does not list" in line
