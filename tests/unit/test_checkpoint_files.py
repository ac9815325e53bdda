"""The files of a --save directory keep their names, keys and values: checkpoints written before
(tests/data/checkpoint_files, written by the code before megatron/checkpoint/layout.py existed)
read back with the values written by hand below, and the writer reproduces them byte for byte.
In-process, no launch.

tests/data/checkpoint_files/main_pp2 is what a 2-rank launch of that code left (the JSON and
tracker files only; DeepSpeed's .pt shards dropped), with tests/support/launcher.py's TINY flags plus
--pipeline-model-parallel-size 2 --train-iters 2 --save-interval 2 --use-rotary-position-embeddings
--swiglu --untie-embeddings-and-output-weights --num-key-value-heads 2 --normalization rmsnorm.
main_layouts.json holds that code's layout dicts (checkpointing._layout) for an MoE and a
TP=2 --no-pipeline-parallel run of TINY, built in-process.
"""
import dataclasses
import glob
import json
import os

import pytest

from megatron.checkpoint.layout import (
    CheckpointLayout,
    read_layout,
    read_model_info,
    read_pointer,
    read_tracker,
    write_layout,
    write_model_info,
    write_tracker,
)
from megatron.config.arguments import parse_args
from megatron.config.validation import validate_args
from megatron.runtime.atomic_write import AtomicFile, write_atomic
from megatron.runtime.refusal import ConfigError
from tests.support.checkpoint_fixtures import checkpoint_manager

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
FILES = os.path.join(HERE, "data", "checkpoint_files")
MAIN = os.path.join(FILES, "main_pp2")
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--lr", "3e-3", "--lr-warmup-iters", "1",
        "--mock-data", "--vocab-size", "600", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--train-iters", "2"]
VARIANT = ["--pipeline-model-parallel-size", "2", "--use-rotary-position-embeddings", "--swiglu",
           "--untie-embeddings-and-output-weights", "--num-key-value-heads", "2", "--normalization", "rmsnorm"]

# megatron_layout.json of main_pp2, by hand: 2 layers, h 64, 4 heads of dim 64 / 4 = 16, 2 kv heads;
# swiglu's ffn int(8 x 64 / 3 / 64) x 64 = 128; vocab 600 padded to a multiple of 128 x TP 1 = 640;
# split by flops (the default when these files were written) because the pipeline engine runs at PP 2
MAIN_LAYOUT = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
               "padded_vocab_size": 640, "max_position_embeddings": 32, "tensor_model_parallel_size": 1,
               "pipeline_model_parallel_size": 2, "ds_pipeline_enabled": True,
               "position_embedding_type": "rotary", "rotary_percent": 1.0, "glu_activation": "swiglu",
               "normalization": "rmsnorm", "embed_layernorm": False, "add_bias_linear": True,
               "num_key_value_heads": 2, "kv_channels": 16, "untie_embeddings_and_output_weights": True,
               "pp_partition_method": "flops"}
MOE_KEYS = ["num_experts", "expert_interval", "topk", "mlp_type", "moe_expert_parallel_size",
            "enable_expert_tensor_parallelism"]


def run_args(extra, world_size):
    """The validated arguments of a run, with the shape completed as initialize_megatron does once
    the (null) tokenizer of --vocab-size 600 is built."""
    args = validate_args(parse_args(args_list=TINY + extra), world_size=world_size, cuda_available=False)
    args.model_shape = dataclasses.replace(args.model_shape, vocab_size=600)  # args.padded_vocab_size follows
    return args


def test_files_written_before_read_with_their_values():
    assert read_tracker(MAIN, f"--load {MAIN}") == 2
    assert read_pointer(os.path.join(MAIN, "latest")) == "global_step2"
    layout = read_layout(os.path.join(MAIN, "global_step2"), f"--load {MAIN}")
    assert layout.to_dict() == MAIN_LAYOUT
    assert list(layout.to_dict()) == list(MAIN_LAYOUT)  # the key order on disk too
    assert (layout.tensor_model_parallel_size, layout.pipeline_model_parallel_size, layout.ds_pipeline_enabled,
            layout.num_experts, layout.describe()) == (1, 2, True, None, "TP=1 x PP=2")
    info = read_model_info(os.path.join(MAIN, "global_step2"))
    assert (info["vocab_size"], info["seq_length"], info["make_vocab_size_divisible_by"], info["tokenizer_type"],
            info["params_dtype"], info["rope_theta"]) == (600, 32, 128, "NullTokenizer", "float32", 10000.0)
    # the reader the converter and resharding use sees the same
    from megatron.checkpoint.reshard import Checkpoint
    checkpoint = Checkpoint(MAIN)
    assert (checkpoint.iteration, checkpoint.tp, checkpoint.pp, checkpoint.pipeline) == (2, 1, 2, True)
    assert (checkpoint.shape.num_key_value_heads, checkpoint.shape.padded_vocab_size, checkpoint.shape.seq_length,
            checkpoint.shape.pp_partition_method) == (2, 640, 32, "flops")


def test_writer_reproduces_the_files_written_before(tmp_path):
    args = run_args(VARIANT + ["--pp-partition-method", "flops"], world_size=2)  # the split they were written with
    args.save = str(tmp_path)
    step = str(tmp_path / "global_step2")
    os.makedirs(step)
    write_layout(step, CheckpointLayout.from_shape(args.model_shape, args.ds_pipeline_enabled))
    write_model_info(step, checkpoint_manager(args).model_info())
    write_tracker(str(tmp_path), 2)
    for name in ("latest", "latest_checkpointed_iteration.txt", "global_step2/megatron_layout.json",
                 "global_step2/megatron_model.json"):
        with open(os.path.join(MAIN, name), "rb") as before, open(tmp_path / name, "rb") as now:
            assert now.read() == before.read(), name
    assert sorted(os.listdir(tmp_path)) == ["global_step2", "latest", "latest_checkpointed_iteration.txt"]
    assert sorted(os.listdir(tmp_path / "global_step2")) == ["megatron_layout.json", "megatron_model.json"]

    with open(os.path.join(FILES, "main_layouts.json")) as f:
        before = json.load(f)
    moe = run_args(["--num-experts", "4", "--moe-expert-parallel-size", "2", "--topk", "2", "--mlp-type", "residual",
                    "--expert-interval", "1"], 2)
    moe = CheckpointLayout.from_shape(moe.model_shape, True)
    assert json.dumps(moe.to_dict(), indent=1) == json.dumps(before["moe"], indent=1)
    assert list(moe.to_dict())[9:15] == MOE_KEYS  # an MoE model's keys follow the nine sizes and cuts
    assert moe.to_dict()["num_experts"] == [4] and moe.to_dict()["enable_expert_tensor_parallelism"] is False
    no_pipe = run_args(["--tensor-model-parallel-size", "2", "--no-pipeline-parallel"], 2)
    no_pipe = CheckpointLayout.from_shape(no_pipe.model_shape, no_pipe.ds_pipeline_enabled)
    assert json.dumps(no_pipe.to_dict(), indent=1) == json.dumps(before["tp2_no_pipeline"], indent=1)
    # 600 padded to a multiple of 128 x TP 2 = 768; no split key without the pipeline engine, no MoE keys
    assert no_pipe.to_dict()["padded_vocab_size"] == 768 and "pp_partition_method" not in no_pipe.to_dict()
    assert not set(MOE_KEYS) & set(no_pipe.to_dict())
    # the layout read back equals the one written (what --load compares)
    assert CheckpointLayout.from_dict(moe.to_dict(), "x") == moe


def test_old_and_foreign_layouts(tmp_path):
    # written before variants and the split were recorded: a GPT-2 (kv heads = heads, head dim 64 / 4),
    # split by type:transformer at PP 2 on the pipeline engine
    old = {k: MAIN_LAYOUT[k] for k in list(MAIN_LAYOUT)[:9]}
    layout = CheckpointLayout.from_dict(old, "old")
    assert (layout.position_embedding_type, layout.glu_activation, layout.normalization, layout.num_key_value_heads,
            layout.kv_channels, layout.untie_embeddings_and_output_weights, layout.pp_partition_method) == \
        ("absolute", None, "layernorm", 4, 16, False, "type:transformer")
    assert CheckpointLayout.from_dict({**old, "ds_pipeline_enabled": False}, "old").pp_partition_method is None
    # what a refused --load names: shape keys only (not TP, the padded vocab, the split), the
    # variant's first, then the sizes, then experts only this run has
    saved = CheckpointLayout.from_dict(MAIN_LAYOUT, "main")
    wider = dataclasses.replace(saved, hidden_size=128, kv_channels=32, ffn_hidden_size=256, padded_vocab_size=768,
                                tensor_model_parallel_size=2, pp_partition_method="uniform", num_experts=[2],
                                expert_interval=2, topk=1, mlp_type="standard", moe_expert_parallel_size=1,
                                enable_expert_tensor_parallelism=False)
    assert saved.shape_differences(wider) == [("kv_channels", 16, 32), ("hidden_size", 64, 128),
                                              ("ffn_hidden_size", 128, 256), ("num_experts", None, [2]),
                                              ("expert_interval", None, 2), ("topk", None, 1),
                                              ("mlp_type", None, "standard"), ("moe_expert_parallel_size", None, 1),
                                              ("enable_expert_tensor_parallelism", None, False)]
    step = tmp_path / "global_step5"
    step.mkdir()
    (step / "megatron_layout.json").write_text(json.dumps({**MAIN_LAYOUT, "mla_rank": 8}))
    with pytest.raises(ConfigError) as error:
        read_layout(str(step), "--load DIR")
    assert str(error.value) == (f"{step}/megatron_layout.json: layout keys mla_rank=8 are unknown to this version "
                                f"of the code; read it with the trainer version that wrote it")
    os.remove(step / "megatron_layout.json")
    with pytest.raises(ConfigError, match=f"^--load DIR: {step}/megatron_layout.json is missing; the checkpoint "
                                          f"was not written by this trainer$"):
        read_layout(str(step), "--load DIR")
    assert read_tracker(str(tmp_path), "--load DIR") is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("five\n")
    with pytest.raises(ConfigError, match="^--load DIR: latest_checkpointed_iteration.txt holds 'five', not an "
                                          "iteration number$"):
        read_tracker(str(tmp_path), "--load DIR")


def test_atomic_write_never_leaves_a_partial_file(tmp_path):
    path = str(tmp_path / "pointer")
    write_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with AtomicFile(path) as f:
            f.write("half of the ne")
            assert open(path).read() == "old"  # nothing under the final name until the rename
            raise RuntimeError("the writer dies")
    assert open(path).read() == "old"
    assert not glob.glob(str(tmp_path / "*.tmp*"))
    write_atomic(path, b"\x00new")
    assert open(path, "rb").read() == b"\x00new"
    assert os.listdir(tmp_path) == ["pointer"]
