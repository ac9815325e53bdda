"""Norms: LayerNorm (apex's fused kernel on CUDA when apex is importable, torch's otherwise) and
RMSNorm (torch's: a weight, no bias), chosen by --normalization."""
import torch

try:
    from apex.normalization import FusedLayerNorm as _ApexLayerNorm
except ImportError:  # apex is optional
    _ApexLayerNorm = None

LayerNorm = _ApexLayerNorm if (_ApexLayerNorm is not None and torch.cuda.is_available()) else torch.nn.LayerNorm
RMSNorm = torch.nn.RMSNorm
LAYER_NORM_TYPES = tuple(t for t in (torch.nn.LayerNorm, _ApexLayerNorm, RMSNorm) if t is not None)


def norm_class(normalization: str) -> type[torch.nn.Module]:
    """The transformer's norms (input, post-attention, final) as the shape says; both classes take
    (hidden_size, eps=...), so DeepSpeed's LayerSpec can build either."""
    return RMSNorm if normalization == "rmsnorm" else LayerNorm
