"""Positions without a learned table: rotary embeddings (Su et al.) applied to q and k of every
head over its first rotary_dim channels (the full head dim, or Microsoft's --rotary-percent share,
the rest passing through as in GPT-NeoX / GPT-J), and ALiBi (Press et al.) biases with one slope per head. Both are
parameter-free and elementwise (not counted as FLOPs)."""
import math

import torch


def rotary_tables(seq_length: int, rotary_dim: int, theta: float,
                  device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [s, r] for channel pairs (i, i + r/2) of the r rotated channels, the GPT-NeoX / LLaMA
    "rotate half" layout; the frequencies are spaced over r, not the head dim (as both do)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32, device=device), inv_freq)  # [s, d/2]
    angles = torch.cat((angles, angles), dim=-1)                                                     # [s, d]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, s, d]: its first r = cos.size(-1) channels rotated by position, the other d - r
    unchanged; computed in fp32, returned in x's dtype."""
    r = cos.size(-1)
    x_rot, x_pass = x.float()[..., :r], x[..., r:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat(((x_rot * cos + rotated * sin).to(x.dtype), x_pass), dim=-1)


def alibi_slopes(num_heads: int) -> list[float]:
    """BigScience's / the ALiBi paper's slopes: a geometric sequence starting at 2^(-8/n) for n a
    power of 2; otherwise those of the closest smaller power of 2, then every other slope of the
    next power of 2."""
    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][:num_heads - closest]


def alibi_causal_bias(slopes: torch.Tensor, seq_length: int, device: torch.device | str | None,
                      dtype: torch.dtype) -> torch.Tensor:
    """[heads, s, s]: slope x (key position - query position) on and below the diagonal, -inf
    above it (the causal mask, folded in so one additive mask does both)."""
    pos = torch.arange(seq_length, device=device)
    distance = (pos[None, :] - pos[:, None]).to(torch.float32)                  # [s, s], <= 0 where allowed
    bias = slopes.to(device=device, dtype=torch.float32)[:, None, None] * distance
    causal = torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).triu_(1)
    return bias.masked_fill(causal, float("-inf")).to(dtype)
