"""Model-parallel utilities (the `mpu` Megatron and DeepSpeed talk about)."""
from .cross_entropy import vocab_parallel_cross_entropy  # noqa: F401
from .layers import (  # noqa: F401
                     ColumnParallelLinear,
                     RowParallelLinear,
                     VocabParallelEmbedding,
                     linear_with_sequence_gather,
                     mark_sequence_parallel,
)
from .mappings import (  # noqa: F401
                       copy_to_tensor_model_parallel_region,
                       gather_from_tensor_model_parallel_region,
                       reduce_from_tensor_model_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region,
)
from .parallel_state import *  # noqa: F401,F403
from .random import checkpoint, get_cuda_rng_tracker, model_parallel_seed  # noqa: F401
from .sequence_parallel import install_sequence_parallel_grad_allreduce  # noqa: F401
from .ulysses import gather_sequence, sequence_chunk, sequence_parallel_attention  # noqa: F401
