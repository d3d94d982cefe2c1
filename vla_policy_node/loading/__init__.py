# SPDX-License-Identifier: Apache-2.0
"""
Checkpoint folders -> a ready ``Policy``: ``load_policy(checkpoint_dir, device=..., dtype=...)``.

Safe file reading (``checkpoint``), weights (``weights``), LeRobot's and openpi's layouts, and
the LeRobot generation recognised from the files (``generation``, ``processors``). No ROS.
"""

from vla_policy_node.loading.load import build_tiny_policy, load_policy
from vla_policy_node.runtime.policy import Policy

__all__ = ["Policy", "build_tiny_policy", "load_policy"]
