# SPDX-License-Identifier: Apache-2.0
"""
pi0 (LeRobot 0.4.4 ``PI0Policy``, openpi ``pi0``): PaliGemma prefix, Gemma expert suffix.

Suffix of every denoising step, (B, 1 + T, W_expert)::

    [ state_proj(state) | action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), sincos(t)]))) ]

ar-mask [1, 1, 0, ..., 0]: the state token sees the prefix and itself; the action
tokens see the prefix, the state and each other. v = action_out_proj(final norm(last T tokens)).
The state token depends only on the observation, so it is projected once per control step.

Prompt (``model.preprocessing.newline_prompt``, as SmolVLA's): the task plus a trailing newline; BOS prepended, no EOS,
right-padded with id 0 to ``tokenizer_max_length`` (LeRobot's tokenizer step).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from vla_policy_node.model import in_place
from vla_policy_node.model.blocks import action_half, sinusoidal_time_embedding, time_half
from vla_policy_node.model.prefix_cache import PrefixContext, VLAPrefixCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.families.paligemma import BACKBONE_FLOAT32, PaliGemmaFlowModel, PiConfig, backbone_key_rules


class Pi0(PaliGemmaFlowModel):
    """pi0 flow-matching policy network (implements ``model.vla.FlowMatchingVLA``)."""

    FLOAT32_MODULES = BACKBONE_FLOAT32 + ("state_proj", "action_in_proj", "action_out_proj", "action_time_mlp")

    def __init__(self, config: PiConfig, attention_backend: str = "sdpa") -> None:
        super().__init__(config, attention_backend, [1, 1] + [0] * (config.chunk_size - 1), adaptive_norm=False)
        width = config.backbone.expert.width
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)

    def encode_prefix(self, inputs: ModelInputs, cache: VLAPrefixCache) -> PrefixContext:
        if inputs.state is None:
            raise ValueError("pi0 needs the normalized state (B, max_state_dim): it is the first suffix token")
        pad, mask, rope = self.encode_vlm(inputs, cache)
        state_emb = self.state_proj(inputs.state.to(self.state_proj.weight.dtype))[:, None]   # (B, 1, W)
        return PrefixContext(cache, pad, {"mask": mask, "rope": rope, "state_emb": state_emb})

    def time_conditioning(self, timesteps: Tensor) -> list[Tensor]:
        """Return the time half of ``action_time_mlp_in`` for each step, with its bias: (1, 1, W)."""
        emb = sinusoidal_time_embedding(timesteps, self.expert.spec.width,
                                        self.config.min_period, self.config.max_period)
        return [t[None, None] for t in time_half(self.action_time_mlp_in, emb)]

    def velocity(self, x_t: Tensor, time_cond: Tensor, ctx: PrefixContext) -> Tensor:
        t = x_t.shape[1]
        action = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))           # (B, T, W)
        h = self.action_time_mlp_out(in_place.silu_of_sum(action_half(self.action_time_mlp_in, action), time_cond))
        suffix = torch.cat([ctx.extras["state_emb"].to(h.dtype), h], dim=1).to(self.expert.dtype)
        out = self.expert(suffix, ctx.extras["rope"], ctx.extras["mask"], ctx.cache, self.backend, num_out=t)
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()


def key_rules() -> list[tuple[str, Optional[str]]]:
    """Map LeRobot (``model.``-rooted) and openpi checkpoint names -> this module's names; None = not loaded."""
    return backbone_key_rules(["state_proj", "action_in_proj", "action_out_proj",
                               "action_time_mlp_in", "action_time_mlp_out"])
