# SPDX-License-Identifier: Apache-2.0
"""
A planar arm over a table: forward and inverse kinematics, joint limits, pure numpy.

The arm turns in the table plane (a SCARA-like top view): joint i rotates link i about
the end of link i - 1, the base sits at the origin and angle 0 points along +x. World
units are metres and radians; the table spans x in [-0.5, 0.5], y in [0, 0.8].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

JOINT_NAMES = ("shoulder", "elbow", "wrist")


@dataclass(frozen=True)
class PlanarArm:
    """Link lengths and joint limits of the simulated arm; ``fk`` and ``ik`` are exact inverses."""

    link_lengths: tuple[float, ...] = (0.32, 0.26, 0.12)
    lower: tuple[float, ...] = (-1.6, -2.6, -2.6)
    upper: tuple[float, ...] = (3.2, 2.6, 2.6)
    max_velocity: float = 2.0          # rad/s per joint, what the simulated motors can do

    def __post_init__(self) -> None:
        n = len(self.link_lengths)
        if n < 3 or len(self.lower) != n or len(self.upper) != n:
            raise ValueError(f"link_lengths, lower and upper need the same length >= 3, got "
                             f"{len(self.link_lengths)}, {len(self.lower)}, {len(self.upper)}")
        if any(lo >= hi for lo, hi in zip(self.lower, self.upper)):
            raise ValueError(f"every lower limit must be below its upper limit: {self.lower} / {self.upper}")

    @property
    def num_joints(self) -> int:
        return len(self.link_lengths)

    def clip(self, q: np.ndarray) -> np.ndarray:
        """Clip joint positions (..., J) into the limits."""
        return np.clip(q, self.lower, self.upper)

    def joint_points(self, q: np.ndarray) -> np.ndarray:
        """Joint positions (J,) -> the base, every joint and the tip in the plane, (J + 1, 2)."""
        q = np.asarray(q, dtype=np.float64)
        if q.shape != (self.num_joints,):
            raise ValueError(f"q must have shape ({self.num_joints},), got {q.shape}")
        angles = np.cumsum(q)
        steps = np.asarray(self.link_lengths)[:, None] * np.stack([np.cos(angles), np.sin(angles)], axis=1)
        return np.vstack([np.zeros((1, 2)), np.cumsum(steps, axis=0)])

    def tip(self, q: np.ndarray) -> np.ndarray:
        """Forward kinematics: the end effector's (x, y)."""
        return self.joint_points(q)[-1]

    def ik(self, target: np.ndarray) -> np.ndarray:
        """
        Joint positions that put the tip on ``target`` (x, y), the last link pointing away from the base.

        Fixing the last link's heading to the target's bearing removes the redundancy;
        the middle joints take the elbow-left solution. Raises ValueError when unreachable.
        """
        target = np.asarray(target, dtype=np.float64)
        heading = float(np.arctan2(target[1], target[0]))
        *inner, last = self.link_lengths
        wrist = target - last * np.array([np.cos(heading), np.sin(heading)])
        # Links before the last two are folded into the shoulder angle: only 3 joints are solved.
        if len(inner) != 2:
            raise ValueError("ik is implemented for 3-joint arms")
        l1, l2 = inner
        d2 = float(wrist @ wrist)
        cos_elbow = (d2 - l1 * l1 - l2 * l2) / (2 * l1 * l2)
        if not -1.0 <= cos_elbow <= 1.0:
            raise ValueError(f"target {target.tolist()} is out of reach")
        elbow = float(np.arccos(cos_elbow))
        shoulder = float(np.arctan2(wrist[1], wrist[0]) - np.arctan2(l2 * np.sin(elbow), l1 + l2 * np.cos(elbow)))
        q = np.array([shoulder, elbow, heading - shoulder - elbow])
        if np.any(q < np.asarray(self.lower) - 1e-9) or np.any(q > np.asarray(self.upper) + 1e-9):
            raise ValueError(f"target {target.tolist()} needs joints {q.tolist()} outside the limits")
        return q
