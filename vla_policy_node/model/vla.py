# SPDX-License-Identifier: Apache-2.0
"""The contract a model family implements so the runtime can run it (prefix once, then denoise)."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from vla_policy_node.model.prefix_cache import PrefixContext, VLAPrefixCache
from vla_policy_node.model.types import ModelInputs


class FlowMatchingVLA(Protocol):
    """What a model family implements."""

    num_cache_layers: int      # layers whose K/V the prefix pass caches
    chunk_size: int
    max_action_dim: int

    def encode_prefix(self, inputs: ModelInputs, cache: VLAPrefixCache) -> PrefixContext:
        """Run the VLM once over images, language (and state), filling ``cache``."""

    def time_conditioning(self, timesteps: Tensor) -> list[Tensor]:
        """Per-step constants of the fixed schedule (time embeddings), computed once."""

    def velocity(self, x_t: Tensor, time_cond: Tensor, ctx: PrefixContext) -> Tensor:
        """v(x_t, t) for x_t (B, T, max_action_dim) against the frozen prefix; float32 out."""
