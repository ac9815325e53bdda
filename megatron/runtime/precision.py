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
