"""LayerNorm: apex's fused kernel on CUDA when apex is importable, torch's otherwise."""
import torch

try:
    from apex.normalization import FusedLayerNorm as _ApexLayerNorm
except ImportError:  # apex is optional
    _ApexLayerNorm = None

LayerNorm = _ApexLayerNorm if (_ApexLayerNorm is not None and torch.cuda.is_available()) else torch.nn.LayerNorm
LAYER_NORM_TYPES = tuple(t for t in (torch.nn.LayerNorm, _ApexLayerNorm) if t is not None)
