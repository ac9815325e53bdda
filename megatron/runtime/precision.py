"""The run's number format as one frozen value (fp16 / bf16 / fp32 and the parameters' dtype), below
every component that reads it (checkpoint, metrics, training). Torch-free at import."""
import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Precision:
    fp16: bool
    bf16: bool
    params_dtype: "torch.dtype"

    @property
    def name(self) -> str:
        return "fp16" if self.fp16 else ("bf16" if self.bf16 else "fp32")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Precision":
        return cls(args.fp16, args.bf16, args.params_dtype)


def softmax_in_fp32(args: argparse.Namespace) -> bool:
    """Megatron-DeepSpeed's rule (CoreAttention): the attention softmax runs in fp32 with
    --attention-softmax-in-fp32 or with query-key layer scaling (on by default;
    --no-query-key-layer-scaling turns it off), and in the activations' dtype otherwise."""
    scaling = getattr(args, "apply_query_key_layer_scaling", True)
    return bool(getattr(args, "attention_softmax_in_fp32", False) or scaling)
