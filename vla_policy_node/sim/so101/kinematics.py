# SPDX-License-Identifier: Apache-2.0
"""
Forward and inverse kinematics of the SO-101's gripper tip, on the MuJoCo model.

The tip is ``gripperframe`` (between the jaws' ends). Inverse kinematics solves the four
joints that place it (pan, lift, elbow, wrist flex) by damped least squares on MuJoCo's
Jacobians, with the jaws pitched ``pitch`` below the horizontal toward the target: 75
degrees reaches every point of the task's table area from the same seed, with wrist roll 0.
"""

from __future__ import annotations

import mujoco
import numpy as np

ARM = (0, 1, 2, 3)            # shoulder_pan, shoulder_lift, elbow_flex, wrist_flex


class Kinematics:
    """The tip's position for joint positions, and joint positions for a tip position."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self._data = mujoco.MjData(model)             # private: never the simulation's state
        self._site = model.site("gripperframe").id
        self._pan_x = float(model.body("shoulder").pos[0])
        self.lower = model.jnt_range[:6, 0].copy()
        self.upper = model.jnt_range[:6, 1].copy()

    def tip(self, q: np.ndarray) -> np.ndarray:
        """Tip position (3,) in the world for arm joints ``q`` (6,)."""
        self._data.qpos[:6] = q
        mujoco.mj_kinematics(self.model, self._data)
        return self._data.site_xpos[self._site].copy()

    def solve(self, target: np.ndarray, pitch: float = np.deg2rad(75.0), iterations: int = 150,
              gripper: float = 0.0) -> np.ndarray:
        """Joint positions (6,) that put the tip on ``target`` (x, y, z) with the jaws ``pitch`` below horizontal."""
        target = np.asarray(target, dtype=np.float64)
        radial = np.array([target[0] - self._pan_x, target[1], 0.0])
        radial /= max(float(np.linalg.norm(radial)), 1e-9)
        want = np.cos(pitch) * radial + np.array([0.0, 0.0, -np.sin(pitch)])   # direction of the jaws
        q = np.zeros(6)
        q[0] = np.arctan2(-target[1], target[0] - self._pan_x)
        q[1:4] = (0.3, 0.0, 1.0)
        q[5] = gripper
        arm = list(ARM)
        jac_pos, jac_rot = np.zeros((3, self.model.nv)), np.zeros((3, self.model.nv))
        for _ in range(iterations):
            self._data.qpos[:6] = q
            mujoco.mj_kinematics(self.model, self._data)
            mujoco.mj_comPos(self.model, self._data)
            mujoco.mj_jacSite(self.model, self._data, jac_pos, jac_rot, self._site)
            x, y, z = self._data.site_xmat[self._site][[0, 3, 6]]          # the jaws' direction
            turn = (y * want[2] - z * want[1], z * want[0] - x * want[2], x * want[1] - y * want[0])
            error = np.concatenate([target - self._data.site_xpos[self._site], 0.3 * np.asarray(turn)])
            if error @ error < 1e-10:
                break
            jac = np.vstack([jac_pos[:, arm], 0.3 * jac_rot[:, arm]])
            step = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), error)
            q[arm] = np.clip(q[arm] + step, self.lower[arm], self.upper[arm])
        return q
