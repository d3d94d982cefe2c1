# SPDX-License-Identifier: Apache-2.0
"""
The flow-matching training objective, as LeRobot's SmolVLA computes it.

With actions a (B, T, A) and noise e ~ N(0, I), a time t ~ Beta(1.5, 1) * 0.999 + 0.001
per sample gives x_t = t * e + (1 - t) * a; the model's velocity at (x_t, t) is
regressed onto u = e - a with a mean squared error. Sampling (``model.flow``) then
integrates from t = 1 (noise) to t = 0 (actions). The network is the runtime's own
``SmolVLA``: its prefix pass fills a ``VLAPrefixCache`` that is frozen before the
expert reads it, exactly as at inference, with autograd on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vla_policy_node.model.families.smolvla import SmolVLA
from vla_policy_node.model.prefix_cache import VLAPrefixCache
from vla_policy_node.model.types import ModelInputs

TIME_BETA = (1.5, 1.0)        # LeRobot's sample_time: Beta(1.5, 1.0) * 0.999 + 0.001


def sample_time(batch: int) -> Tensor:
    """Flow times (B,), float32, biased toward t = 1 (noisier inputs); seeded by ``torch.manual_seed``."""
    beta = torch.distributions.Beta(torch.tensor(TIME_BETA[0]), torch.tensor(TIME_BETA[1]))
    return (beta.sample((batch,)) * 0.999 + 0.001).to(torch.float32)


def sample_noise(shape: tuple[int, ...]) -> Tensor:
    """Draw standard normal noise, float32; seeded by ``torch.manual_seed``."""
    return torch.randn(shape, dtype=torch.float32)


def flow_matching_loss(model: SmolVLA, inputs: ModelInputs, actions: Tensor, noise: Tensor, time: Tensor) -> Tensor:
    """
    Mean squared error between the predicted and the target velocity, averaged over everything.

    ``actions`` and ``noise`` are (B, chunk, max_action_dim) in the normalized space,
    ``time`` is (B,). Returns a scalar.
    """
    if actions.shape != noise.shape or actions.shape[0] != time.shape[0]:
        raise ValueError(f"actions {tuple(actions.shape)}, noise {tuple(noise.shape)} and time "
                         f"{tuple(time.shape)} disagree")
    t = time[:, None, None]
    x_t = t * noise + (1 - t) * actions
    target = noise - actions
    cache = VLAPrefixCache()
    ctx = model.encode_prefix(inputs, cache)
    cache.freeze(model.num_cache_layers)
    time_cond = torch.cat(model.time_conditioning(time), dim=0)      # (B, 1, W_expert)
    velocity = model.velocity(x_t, time_cond, ctx)
    return torch.nn.functional.mse_loss(velocity, target)
