"""ZeRO 1's flat groups are padded to a multiple of 2 x DP elements (DeepSpeed's
nccl_start_alignment_factor x DP) before each DP rank takes its slice. The trainer's models have
sizes that are multiples of 4, where padding to 2 x DP and to DP agree at DP = 2; this model's
groups (14 and 2 elements) are not, so the prediction must pad as DeepSpeed does. DeepSpeed's
ZeRO optimizer is built on two real gloo ranks (no step runs) and the fp32 partitions it allocated
are measured; Adam's state over them (two fp32 moments and a step per partition, created at the
first step) is counted by hand, as test_memory_measured.py measures it after a real step."""
from tests.support.distributed import run_distributed


def _zero1_partitions():
    import deepspeed
    import torch
    model = torch.nn.Linear(7, 2)  # weight 14 elements (decayed group), bias 2 (undecayed group)
    groups = [{"params": [model.weight], "weight_decay": 0.1}, {"params": [model.bias], "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-3),
                                           config={"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10 ** 9,
                                                   "zero_optimization": {"stage": 1}})
    zero = engine.optimizer
    return [p.numel() for p in zero.single_partition_of_fp32_groups]


def test_zero1_partitions_pad_to_twice_the_data_parallel_size():
    from megatron.metrics.memory import HeldParameter, TrainingSetup, model_state_bytes
    ranks = run_distributed(2, _zero1_partitions, timeout=180)
    # by hand: 14 -> 16 (a multiple of 2 x DP = 4), 8 per rank; 2 -> 4, 2 per rank
    assert ranks == [[8, 2], [8, 2]]
    params = [HeldParameter(14, True, True), HeldParameter(2, False, True)]
    for dp_rank, partitions in enumerate(ranks):
        _, _, predicted, _ = model_state_bytes(params, TrainingSetup(zero_stage=1, data_parallel_size=2), dp_rank)
        # the fp32 partition 4 B and Adam's two moments 8 B per element, a 4-byte step per group
        assert predicted == sum(12 * n for n in partitions) + 4 * len(partitions) == (8 + 2) * 12 + 2 * 4
