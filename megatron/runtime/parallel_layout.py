"""The parallel layout of the run as one frozen value, below every component that reads it
(checkpoint, metrics, training): torch-free, built once by initialize_megatron."""
import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    """The TP x PP x DP (x EP) layout and this process's rank. After initialization it is the one
    owner of the parallel sizes (torchtitan's ParallelDims): initialize_megatron builds it once per
    process, right after torch.distributed starts, and keeps it as `args.run_config.parallel`. The
    other holders exist for readers that cannot reach it, and each is made from it or checked
    against it:
    - the mpu process groups (megatron/mpu/parallel_state.py) are built from its sizes, and their
      data-parallel size is checked against it;
    - once args is frozen (FrozenArgs), args.tensor_model_parallel_size, ...data_parallel_size,
      .world_size and .rank read it, so get_args() readers and launch-script flags keep working;
    - ModelShape keeps the TP and PP sizes because the parameter table, the counts, FLOPs and
      tools/param_count.py need them without processes (torch-free); RunConfig refuses a shape
      whose sizes differ from the layout's."""
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int  # DeepSpeed-MoE's EP (1 for a dense model); divides the DP size
    world_size: int
    rank: int
    ds_pipeline_enabled: bool  # DeepSpeed's PipelineModule (False: --no-pipeline-parallel)
    # DeepSpeed-Ulysses (--ds-sequence-parallel-size): a replica is TP x PP x SP ranks, and the
    # world TP x PP x SP x DP; the data-parallel size above counts replicas
    sequence_parallel_size: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ParallelLayout":
        """From validated flags (args.rank: set once torch.distributed started)."""
        return cls(args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size,
                   args.model_shape.moe_expert_parallel_size, args.world_size, args.rank, args.ds_pipeline_enabled,
                   args.ds_sequence_parallel_size)
