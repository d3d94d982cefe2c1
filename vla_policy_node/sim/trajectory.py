# SPDX-License-Identifier: Apache-2.0
"""
Following a joint trajectory in time, as joint_trajectory_controller does (linear interpolation).

A new trajectory replaces the current one from the moment it arrives (header stamp zero
means "start now"): the desired position moves from where the joints were then to point
0 by its ``time_from_start``, then from point to point, and holds the last point after.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class TrajectoryFollower:
    """The desired joint positions over time of the latest trajectory."""

    def __init__(self, num_joints: int) -> None:
        self.num_joints = num_joints
        self._times: Optional[np.ndarray] = None       # (P + 1,) seconds after the start, first 0
        self._points: Optional[np.ndarray] = None      # (P + 1, J), first the joints at the start
        self._start = 0.0

    def set(self, now: float, current: np.ndarray, times: np.ndarray, points: np.ndarray) -> None:
        """Replace the trajectory: ``points`` (P, J) to reach at ``times`` (P,) seconds from ``now``."""
        times = np.asarray(times, dtype=np.float64)
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != self.num_joints or len(times) != len(points) or not len(times):
            raise ValueError(f"expected P >= 1 points of {self.num_joints} joints with P times, got "
                             f"{points.shape} and {times.shape}")
        if not np.all(np.isfinite(points)) or not np.all(np.isfinite(times)):
            raise ValueError("trajectory holds non-finite values")
        if times[0] < 0 or np.any(np.diff(times) <= 0):
            raise ValueError(f"time_from_start must be >= 0 and strictly increasing, got {times.tolist()}")
        self._start = now
        self._times = np.concatenate([[0.0], times])
        self._points = np.vstack([np.asarray(current, dtype=np.float64)[None], points])

    def clear(self) -> None:
        """Forget the trajectory: the joints hold where they are."""
        self._times = self._points = None

    def desired(self, now: float) -> Optional[np.ndarray]:
        """Desired positions (J,) at ``now``; None without a trajectory."""
        if self._times is None or self._points is None:
            return None
        t = now - self._start
        return np.array([np.interp(t, self._times, self._points[:, j]) for j in range(self.num_joints)])
