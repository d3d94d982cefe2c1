# SPDX-License-Identifier: Apache-2.0
"""Public entry point: ``load_policy(checkpoint_dir, device=..., dtype=...)`` and the ``tiny`` random policy."""

from vla_policy_node.core.loading import build_tiny_policy, load_policy
from vla_policy_node.core.policy import Policy

__all__ = ["Policy", "build_tiny_policy", "load_policy"]
