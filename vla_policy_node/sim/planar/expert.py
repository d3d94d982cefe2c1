# SPDX-License-Identifier: Apache-2.0
"""The scripted expert: inverse kinematics to the named block, then a straight joint-space line at a fixed speed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_policy_node.sim.planar.arm import PlanarArm
from vla_policy_node.sim.scene import Scene


@dataclass(frozen=True)
class ScriptedExpert:
    """Moves all joints together (a straight line in joint space) at ``speed`` rad/s toward the IK goal."""

    arm: PlanarArm
    dt: float = 0.05
    speed: float = 1.5        # rad/s of the joint that has the farthest to go

    def goal(self, scene: Scene) -> np.ndarray:
        return self.arm.ik(scene.target_position)

    def action(self, scene: Scene, q: np.ndarray) -> np.ndarray:
        """Return the joint position to command for the next tick, from the current joints ``q`` (J,)."""
        delta = self.goal(scene) - np.asarray(q, dtype=np.float64)
        farthest = float(np.max(np.abs(delta)))
        step = self.speed * self.dt
        return np.asarray(q, dtype=np.float64) + (delta if farthest <= step else delta * (step / farthest))
