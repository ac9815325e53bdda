"""ZeRO-3 partitions parameters at construction (each rank holds an empty local tensor); the
count uses DeepSpeed's `ds_numel` and stays exact."""
from distributed import run_distributed
from model_fixtures import tiny_config


def _count_under_zero3():
    import deepspeed
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    from megatron.utils import compute_parameter_counts
    config = tiny_config()
    with deepspeed.zero.Init(data_parallel_group=mpu.get_data_parallel_group(),
                             config_dict_or_path={"zero_optimization": {"stage": 3},
                                                  "train_micro_batch_size_per_gpu": 1}):
        model = GPTModel(config)
    local = sum(p.numel() for p in model.parameters())
    counts = compute_parameter_counts(model, mpu)
    return local, counts.total, counts.no_embedding


def test_zero3_partitioned_parameters_count_in_full():
    no_embedding = 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
    for local, total, without in run_distributed(2, _count_under_zero3):
        assert local == 0  # really partitioned away
        assert (total, without) == (128 * 32 + 16 * 32 + no_embedding, no_embedding)
