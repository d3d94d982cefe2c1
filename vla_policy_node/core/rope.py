"""Rotary position embeddings (split-half layout), with cos/sin computed once per pass."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """Angles for integer ``positions`` (B, L) -> cos, sin each (B, 1, L, head_dim // 2), float32.

    Computed in float32 whatever the model dtype, as the reference
    implementations do: bfloat16 angles are wrong by whole radians at long positions.
    """
    # Exactly transformers' float32 arithmetic: dividing by base**e instead of multiplying by
    # its reciprocal moves the angle by an ulp, ~6e-5 in cos/sin at position 1000.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / base ** exponents
    radians = positions.to(torch.float32)[..., None] * inv_freq
    return torch.cos(radians)[:, None], torch.sin(radians)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, L, D) by the angles from ``rope_cos_sin``; result in x's dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
