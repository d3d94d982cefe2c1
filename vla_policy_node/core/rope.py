"""Rotary position embeddings (split-half layout), with cos/sin computed once per pass."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """Angles for integer ``positions`` (B, L) -> cos, sin each (B, 1, L, head_dim // 2), float32.

    Computed in float32 whatever the model dtype, as the reference
    implementations do: bfloat16 angles are wrong by whole radians at long positions.
    """
    half = head_dim // 2
    exponents = (2.0 / head_dim) * torch.arange(half, dtype=torch.float32, device=positions.device)
    timescale = base ** exponents
    radians = positions.to(torch.float32)[..., None] / timescale
    return torch.cos(radians)[:, None], torch.sin(radians)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, L, D) by the angles from ``rope_cos_sin``; result in x's dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
