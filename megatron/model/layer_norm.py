"""Norms: LayerNorm (apex's fused kernel on CUDA when apex is importable, torch's otherwise) and
RMSNorm (torch's: a weight, no bias), chosen by --normalization, with Megatron's two options:
--apply-layernorm-1p (the weight stores gamma - 1) and an fp32 input under half-precision
weights (--fp32-residual-connection)."""
import torch
import torch.nn.functional as F

try:
    from apex.normalization import FusedLayerNorm as _ApexLayerNorm
except ImportError:  # apex is optional
    _ApexLayerNorm = None


class _MegatronNorm:
    """What both norms add to torch's. one_plus (--apply-layernorm-1p, Megatron's zero-centered
    gamma): the stored weight is gamma - 1, initialised to 0, and the norm scales by weight + 1 --
    the same parameters, a different value stored (weight decay pulls gamma towards 1, not 0).
    An input of another dtype than the weight (the fp32 residual stream with bf16 / fp16
    weights) is normalised in fp32 and returned in the weight's dtype, as Megatron's mixed-dtype
    fused LayerNorm does."""
    one_plus: bool
    weight: torch.nn.Parameter

    def _gamma(self) -> torch.Tensor:
        return self.weight + 1 if self.one_plus else self.weight

    def _zero_centre(self) -> None:
        if self.one_plus:
            with torch.no_grad():
                self.weight.zero_()

    def _mixed(self, x: torch.Tensor, norm) -> torch.Tensor:
        gamma = self._gamma()
        if x.dtype == gamma.dtype:
            return norm(x, gamma)
        return norm(x.float(), gamma.float()).to(gamma.dtype)


class LayerNorm(_MegatronNorm, torch.nn.LayerNorm):
    def __init__(self, hidden_size: int, eps: float = 1e-5, one_plus: bool = False) -> None:
        self.one_plus = one_plus  # before torch's __init__, which calls reset_parameters
        super().__init__(hidden_size, eps=eps)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._zero_centre()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        return self._mixed(x, lambda x, gamma: F.layer_norm(x, self.normalized_shape, gamma,
                                                            bias.to(gamma.dtype), self.eps))


class RMSNorm(_MegatronNorm, torch.nn.RMSNorm):
    def __init__(self, hidden_size: int, eps: float = 1e-5, one_plus: bool = False) -> None:
        self.one_plus = one_plus
        super().__init__(hidden_size, eps=eps)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._zero_centre()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mixed(x, lambda x, gamma: F.rms_norm(x, self.normalized_shape, gamma, self.eps))


LAYER_NORM_TYPES = tuple(t for t in (torch.nn.LayerNorm, _ApexLayerNorm, torch.nn.RMSNorm) if t is not None)


def norm_class(normalization: str, one_plus: bool = False, mixed: bool = False) -> type[torch.nn.Module]:
    """The transformer's norms (input, post-attention, final) as the shape says; every class takes
    (hidden_size, eps=...), and ours one_plus=..., so DeepSpeed's LayerSpec can build each. apex's
    fused LayerNorm (CUDA) serves the plain case only: it has neither option."""
    if normalization == "rmsnorm":
        return RMSNorm
    if _ApexLayerNorm is not None and torch.cuda.is_available() and not (one_plus or mixed):
        return _ApexLayerNorm
    return LayerNorm


def norm_spec(normalization: str, hidden_size: int, eps: float, one_plus: bool = False,
              mixed: bool = False) -> tuple[type[torch.nn.Module], dict]:
    """(class, keyword arguments) of a norm: what a LayerSpec or a direct build takes."""
    cls = norm_class(normalization, one_plus, mixed)
    kwargs = {"eps": eps, **({"one_plus": one_plus} if cls in (LayerNorm, RMSNorm) else {})}
    return cls, kwargs


def build_norm_module(normalization: str, hidden_size: int, eps: float, one_plus: bool = False,
                      mixed: bool = False) -> torch.nn.Module:
    cls, kwargs = norm_spec(normalization, hidden_size, eps, one_plus, mixed)
    return cls(hidden_size, **kwargs)
