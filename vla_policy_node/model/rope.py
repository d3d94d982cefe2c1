# SPDX-License-Identifier: Apache-2.0
"""Rotary position embeddings (split-half layout), with cos/sin computed once per pass."""

from __future__ import annotations

import torch
from torch import Tensor

from vla_policy_node.model import in_place


def rope_cos_sin(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """
    Angles for integer ``positions`` (B, L) -> cos, signed sin, each (B, 1, L, head_dim), float32.

    Full width, sin negated on the first half, so ``apply_rope`` needs no slicing.

    Computed in float32 whatever the model dtype, as the reference
    implementations do: bfloat16 angles are wrong by whole radians at long positions.
    """
    # Exactly transformers' float32 arithmetic: dividing by base**e instead of multiplying by
    # its reciprocal moves the angle by an ulp, ~6e-5 in cos/sin at position 1000.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / base ** exponents
    radians = positions.to(torch.float32)[..., None] * inv_freq
    cos, sin = torch.cos(radians), torch.sin(radians)
    return torch.cat([cos, cos], -1)[:, None], torch.cat([-sin, sin], -1)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """
    Rotate x (B, H, L, D) by the angles from ``rope_cos_sin``; result in x's dtype.

    ``[x1, x2] * cos + [x2, x1] * [-sin, sin]`` is ``[x1 cos - x2 sin, x2 cos + x1 sin]``
    bit for bit, in four kernels instead of eleven (the expert step is launch-bound).
    """
    xf = x if x.dtype == torch.float32 else x.float()
    rotated = xf.roll(x.shape[-1] // 2, dims=-1)
    if sin.shape[0] in (1, xf.shape[0]) and in_place.allowed():     # sin broadcasts to x's shape
        out = (xf * cos).add_(rotated.mul_(sin))
    else:
        out = xf * cos + rotated * sin
    return out if x.dtype == torch.float32 else out.to(x.dtype)
