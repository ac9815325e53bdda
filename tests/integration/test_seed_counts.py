"""The seed discussion's 52M model (8 layers, hidden 512, heads 8, seq 1024, vocab 50257), built
for real on gloo ranks in every layout: the exact counts on every rank, and the offline
calculator and analytic formula agree with the built model."""
import pytest

from megatron.model.shape import ModelShape, pad_vocab_size
from tests.support.distributed import run_distributed

# split as upstream split the seed's PP=2 run (both forks' default, DeepSpeed's type:transformer);
# this trainer's default would balance FLOPs instead (tests/integration/test_pipeline_partition.py)
SEED_MODEL = dict(num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=1024,
                  max_position_embeddings=1024, ffn_hidden_size=2048, pp_partition_method="type:transformer")
VOCAB = 50257


def _build_and_count(tp, pp, pipeline):
    from megatron import mpu
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel, GPTModelPipe
    from megatron.utils import compute_parameter_counts, parameter_count_mismatches
    shape = ModelShape(**SEED_MODEL, vocab_size=VOCAB, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    config = GPTConfig(shape)
    model = GPTModelPipe(config, mpu.get_topology()) if pipeline else GPTModel(config)
    counts = compute_parameter_counts(model, mpu, shape)
    return counts.total, counts.no_embedding, counts.stages, parameter_count_mismatches(counts, shape)


# the numbers from the seed discussion: 51,500,032 is what DeepSpeed's UNIQUE_PARAMS and
# Megatron-DeepSpeed agree on at TP=1; at TP=2 the vocab pads to 50432 (a multiple of 256)
@pytest.mark.parametrize("tp, pp, pipeline, total", [
    (1, 1, True, 51_500_032),
    (1, 2, True, 51_500_032),
    (2, 1, True, 51_565_568),
    (2, 2, True, 51_565_568),
    (2, 1, False, 51_565_568),
])
def test_seed_52m_model_counts_on_every_rank(tp, pp, pipeline, total):
    results = run_distributed(tp * pp, _build_and_count, tp, pp, pipeline, tp=tp, pp=pp)
    for rank, (parameters, no_embedding, stages, mismatches) in enumerate(results):
        assert parameters == total, f"rank {rank}"
        assert no_embedding == 25_220_096, f"rank {rank}"
        assert mismatches == [], f"rank {rank}: {mismatches}"
        assert [layers for layers, _, _ in stages] == [8 // pp] * pp
    assert len({str(r) for r in results}) == 1  # every rank holds the same integers
    if (tp, pp) == (1, 2):
        # DeepSpeed's STAGE_PARAMS in the seed's PP=2 log: each stage holds a whole embedding
        # (word 50304 x 512 + positions 1024 x 512) and 4 layers of 12 h^2 + 13 h; the last
        # stage adds the final LayerNorm (2 x 512) and owns nothing of its embedding copy
        layer, embedding = 12 * 512 ** 2 + 13 * 512, 50304 * 512 + 1024 * 512
        stages = results[0][2]
        assert [local for _, local, _ in stages] == [38_889_472, 38_890_496]
        assert stages[0][1:] == (embedding + 4 * layer,) * 2
        assert stages[1][1:] == (embedding + 4 * layer + 1024, 4 * layer + 1024)


def test_padded_vocab():
    assert pad_vocab_size(VOCAB, 128, 1) == 50304
    assert pad_vocab_size(VOCAB, 128, 2) == 50432
    assert pad_vocab_size(50304, 128, 1) == 50304


def _count_without_the_replica_flag():
    """The seed discussion's PP bug, reproduced on a real PP=2 model: the last stage's copy of the
    tied embedding counted as if it were owned (DeepSpeed's `ds_pipe_replicated` flag ignored)."""
    from megatron import mpu
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.utils import compute_parameter_counts, parameter_count_mismatches
    from tests.support.model_fixtures import tiny_config
    config = tiny_config(pipeline_model_parallel_size=2)  # 2 layers, hidden 32, vocab 128, seq 16
    model = GPTModelPipe(config, mpu.get_topology())
    for p in model.parameters():
        p.ds_pipe_replicated = False
    return parameter_count_mismatches(compute_parameter_counts(model, mpu, config.shape), config.shape)


def test_a_measured_disagreement_with_the_formula_names_both_numbers():
    h, vocab, seq = 32, 128, 16
    layer = 12 * h * h + 13 * h
    first_stage = vocab * h + seq * h + layer
    last_stage = layer + 2 * h
    for problems in run_distributed(2, _count_without_the_replica_flag, pp=2):
        assert problems == [
            f"word_embeddings: counted {2 * vocab * h:,}, formula {vocab * h:,}",
            f"position_embeddings: counted {2 * seq * h:,}, formula {seq * h:,}",
            f"per-stage owned parameters: counted [{first_stage}, {last_stage + vocab * h + seq * h}], "
            f"formula [{first_stage}, {last_stage}]",
        ]


def _count_with_a_shared_tensor():
    from torch import nn

    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    from megatron.utils import count_local_parameters
    from tests.support.model_fixtures import tiny_config
    config = tiny_config()
    model_shape = config.shape
    model = GPTModel(config)
    before = count_local_parameters(model, 0, model_shape)
    # a separate output layer that shares the word embedding's tensor, as untied-module code does
    model.output_layer = nn.Module()
    model.output_layer.weight = model.word_embeddings_weight()
    return before, count_local_parameters(model, mpu.get_tensor_model_parallel_rank(), model_shape)


def test_a_tensor_registered_twice_counts_once():
    [(before, after)] = run_distributed(1, _count_with_a_shared_tensor)
    assert after == before
