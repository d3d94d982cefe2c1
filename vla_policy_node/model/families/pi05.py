# SPDX-License-Identifier: Apache-2.0
r"""
pi0.5 (LeRobot 0.4.4 ``PI05Policy``, openpi ``pi05``): PaliGemma prefix, adaRMS Gemma expert.

Differences from pi0: no state token (the state is discretised into the prompt,
``pi05_prompt``), the suffix is just ``action_in_proj(x_t)`` (B, T, W_expert) with
ar-mask [1, 0, ..., 0], and time enters through the norms instead of the tokens:

    cond = silu(time_mlp_out(silu(time_mlp_in(sincos(t)))))          (1, W_expert), once per t_k
    every expert norm: x_hat * (1 + scale) + shift, residual += out * gate, [scale, shift, gate] = dense(cond)

Prompt: ``"Task: {task}, State: {bins};\\nAction: "``, BOS prepended, no EOS,
right-padded with id 0 to ``tokenizer_max_length``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

from vla_policy_node.model.blocks import sinusoidal_time_embedding
from vla_policy_node.model.prefix_cache import PrefixContext, VLAPrefixCache
from vla_policy_node.model.types import ModelInputs
from vla_policy_node.model.families.paligemma import BACKBONE_FLOAT32, PaliGemmaFlowModel, PiConfig, backbone_key_rules

STATE_BINS = 256


def discretize_state(normalized_state: np.ndarray, max_state_dim: int, pad: bool = True) -> np.ndarray:
    """
    (D,) normalized state -> int bins: 256 equal bins over [-1, 1].

    ``np.digitize`` over the 256 left bin edges, as LeRobot: values below -1 give -1, values
    >= 1 - 2/256 give 255. ``pad`` (LeRobot 0.4.x) zero-pads to ``max_state_dim`` first, the
    padding landing in bin 128; LeRobot >= 0.5 bins only the robot's own D values.
    """
    state = np.asarray(normalized_state, dtype=np.float32).reshape(-1)
    if state.size > max_state_dim:
        raise ValueError(f"state has {state.size} entries, more than max_state_dim {max_state_dim}")
    padded = np.zeros(max_state_dim if pad else state.size, dtype=np.float32)
    padded[:state.size] = state
    return np.digitize(padded, np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]) - 1


def pi05_prompt(task: str, normalized_state: np.ndarray, max_state_dim: int, pad: bool = True) -> str:
    """Build the text pi0.5 tokenizes (LeRobot's ``Pi05PrepareStateTokenizerProcessorStep``)."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    bins = " ".join(str(int(b)) for b in discretize_state(normalized_state, max_state_dim, pad))
    return f"Task: {cleaned}, State: {bins};\nAction: "


class Pi05(PaliGemmaFlowModel):
    """pi0.5 flow-matching policy network (implements ``model.vla.FlowMatchingVLA``)."""

    FLOAT32_MODULES = BACKBONE_FLOAT32 + ("action_in_proj", "action_out_proj", "time_mlp")

    def __init__(self, config: PiConfig, attention_backend: str = "sdpa") -> None:
        super().__init__(config, attention_backend, [1] + [0] * (config.chunk_size - 1), adaptive_norm=True)
        width = config.backbone.expert.width
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)

    def encode_prefix(self, inputs: ModelInputs, cache: VLAPrefixCache) -> PrefixContext:
        """Run the VLM once; the state is not a token here, it reached the model through the prompt."""
        pad, mask, rope = self.encode_vlm(inputs, cache)
        return PrefixContext(cache, pad, {"mask": mask, "rope": rope})

    def time_conditioning(self, timesteps: Tensor) -> list[Tensor]:
        """Compute the adaRMS condition of each t_k, (1, W) float32 (time MLP kept in float32)."""
        emb = sinusoidal_time_embedding(timesteps, self.expert.spec.width,
                                        self.config.min_period, self.config.max_period)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb.to(self.time_mlp_in.weight.dtype)))))
        return [c[None] for c in cond]

    def velocity(self, x_t: Tensor, time_cond: Tensor, ctx: PrefixContext) -> Tensor:
        t = x_t.shape[1]
        suffix = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype)).to(self.expert.dtype)
        out = self.expert(suffix, ctx.extras["rope"], ctx.extras["mask"], ctx.cache, self.backend,
                          num_out=t, cond=time_cond)
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float()


def key_rules() -> list[tuple[str, Optional[str]]]:
    """Map LeRobot (``model.``-rooted) and openpi checkpoint names -> this module's names; None = not loaded."""
    return backbone_key_rules(["action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"])
