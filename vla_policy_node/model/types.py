# SPDX-License-Identifier: Apache-2.0
"""Tensors exchanged between preprocessing, the model families and the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass
class ModelInputs:
    """
    One batch of observations in the form every family's ``encode_prefix`` takes.

    images       per camera, (B, 3, S, S) float in [-1, 1] at the model resolution
    image_masks  per camera, (B,) bool; False = camera missing, its tokens are masked
    tokens       (B, L) int64 language token ids
    token_mask   (B, L) bool, True = real token
    state        (B, max_state_dim) normalized, zero-padded; None where the
                 family puts the state in the prompt (pi0.5)
    """

    images: list[Tensor]
    image_masks: list[Tensor]
    tokens: Tensor
    token_mask: Tensor
    state: Optional[Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device, dtype: torch.dtype) -> "ModelInputs":
        """Move to the model's device; images and state take the model dtype."""
        return ModelInputs(
            images=[im.to(device=device, dtype=dtype) for im in self.images],
            image_masks=[m.to(device) for m in self.image_masks],
            tokens=self.tokens.to(device),
            token_mask=self.token_mask.to(device),
            state=None if self.state is None else self.state.to(device=device, dtype=dtype),
        )
