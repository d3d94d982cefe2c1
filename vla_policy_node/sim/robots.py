# SPDX-License-Identifier: Apache-2.0
"""
The simulated robots by name: ``so101`` (the SO-101 in MuJoCo, the demo's) and ``planar``.

``planar`` is the 3-joint numpy arm: no physics, renders in microseconds, so the unit and
DDS tests of the node's execution run on it fast; users meet the SO-101. Both have the
same episode protocol (``reset``, ``set_scene``, ``step``, ``drive``, ``observation``,
``expert``, ``to_policy`` / ``from_policy``), which training, the rollouts and the ROS
robot use.
"""

from __future__ import annotations

from typing import Any

ROBOTS = ("so101", "planar")


def make_env(robot: str, **options: Any):
    """Return a new environment of ``robot`` with dataclass ``options`` (dt, max_steps, ...)."""
    if robot == "so101":
        from vla_policy_node.sim.so101.env import So101TouchEnv      # imports MuJoCo
        return So101TouchEnv(**options)
    if robot == "planar":
        from vla_policy_node.sim.env import TouchEnv
        return TouchEnv(**options)
    raise ValueError(f"unknown simulated robot {robot!r}: one of {', '.join(ROBOTS)}")
