# SPDX-License-Identifier: Apache-2.0
"""
The scripted expert of the SO-101 touch task: over the named block, then down onto it.

From the measured joints alone (so its demonstrations are a function of what the policy
sees): while the tip is more than ``near`` from above the block it heads for a pose
``hover`` over it, then for one that presses the tip ``press`` into the block's top; both
along a straight line in joint space at ``speed`` rad/s for the joint with the farthest to
go. Wrist roll 0, gripper closed. 149 of 150 layouts touched, about 24 ticks at 30 Hz.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vla_policy_node.sim.so101.kinematics import Kinematics
from vla_policy_node.sim.scene import Scene


@dataclass
class So101Expert:
    """Joint positions to command next, from the scene and the measured joints (6,) in radians."""

    kinematics: Kinematics
    dt: float
    block_top: float
    speed: float = 2.0
    hover: float = 0.08           # m above the table
    press: float = 0.01           # m below the block's top
    near: float = 0.025           # m, tip to the block's vertical line
    gripper: float = -0.17453     # closed
    _goals: dict = field(default_factory=dict, repr=False)

    def goals(self, scene: Scene) -> tuple[np.ndarray, np.ndarray]:
        """Return (hover pose, touch pose) for the scene's target block, solved once per block position."""
        x, y = scene.target_position
        key = (round(float(x), 6), round(float(y), 6))
        if key not in self._goals:
            over = self.kinematics.solve(np.array([x, y, self.hover]), gripper=self.gripper)
            down = self.kinematics.solve(np.array([x, y, self.block_top - self.press]), gripper=self.gripper)
            self._goals[key] = (over, down)
        return self._goals[key]

    def action(self, scene: Scene, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        over, down = self.goals(scene)
        tip = self.kinematics.tip(q)
        goal = down if np.linalg.norm(tip[:2] - scene.target_position) < self.near else over
        delta = goal - q
        farthest = float(np.max(np.abs(delta)))
        step = self.speed * self.dt
        return q + (delta if farthest <= step else delta * (step / farthest))
