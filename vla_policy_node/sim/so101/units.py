# SPDX-License-Identifier: Apache-2.0
"""
LeRobot's SO-101 units against ROS radians, for the simulated arm (what config/so101.yaml's joint_units say).

LeRobot's SO-101 follower with ``use_degrees=True`` records the five body joints in degrees
of its 4095-tick scale, zero in the middle of the calibrated range (so101_new_calib's zero),
and the gripper as 0..100 of its range (0 closed, 100 open):

    policy = (ros - offset) * scale        ros = policy / scale + offset
"""

from __future__ import annotations

import numpy as np

JOINT_NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
GRIPPER_RANGE = (-0.17453, 1.74533)        # radians, so101_new_calib's gripper joint
DEGREES = 180.0 / np.pi * 4096.0 / 4095.0
SCALE = np.array([DEGREES] * 5 + [100.0 / (GRIPPER_RANGE[1] - GRIPPER_RANGE[0])])
OFFSET = np.array([0.0] * 5 + [GRIPPER_RANGE[0]])


def to_lerobot(q: np.ndarray) -> np.ndarray:
    """Convert joint positions (..., 6) in radians to LeRobot's units (degrees, gripper 0..100)."""
    return (np.asarray(q, dtype=np.float64) - OFFSET) * SCALE


def to_ros(a: np.ndarray) -> np.ndarray:
    """Convert LeRobot's units (..., 6) to radians."""
    return np.asarray(a, dtype=np.float64) / SCALE + OFFSET
