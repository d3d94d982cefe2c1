# SPDX-License-Identifier: Apache-2.0
"""
TouchEnv: the arm, the table-top task and the top camera stepped at the control rate, pure numpy.

An action is the joint position the arm should reach by the next control tick (what
the policy node publishes as a command); the motors move toward it at most at the
arm's maximum velocity. This is the simulator the ROS robot wraps, the expert drives
and the evaluation without ROS runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vla_policy_node.sim.planar.arm import JOINT_NAMES, PlanarArm
from vla_policy_node.sim.planar.camera import TopCamera
from vla_policy_node.sim.planar.expert import ScriptedExpert
from vla_policy_node.sim.planar.task import TaskConfig, sample_scene, touched
from vla_policy_node.sim.scene import Scene

CAMERA_NAME = "top"


@dataclass
class TouchEnv:
    """One simulated robot; ``reset`` starts an episode, ``step`` runs one control tick."""

    arm: PlanarArm = field(default_factory=PlanarArm)
    task: TaskConfig = field(default_factory=TaskConfig)
    camera: TopCamera = field(default_factory=TopCamera)
    dt: float = 0.05                     # s per control tick (20 Hz)
    max_steps: int = 100
    joint_names: tuple[str, ...] = JOINT_NAMES
    camera_name: str = CAMERA_NAME

    def __post_init__(self) -> None:
        if len(self.joint_names) != self.arm.num_joints:
            raise ValueError(f"joint_names has {len(self.joint_names)} names for {self.arm.num_joints} joints")
        self.scene: Scene | None = None
        self.q = np.zeros(self.arm.num_joints)
        self.steps = 0
        self.success = False

    @property
    def num_joints(self) -> int:
        return self.arm.num_joints

    @property
    def image_size(self) -> int:
        return max(self.camera.height, self.camera.width)

    def expert(self) -> ScriptedExpert:
        return ScriptedExpert(self.arm, self.dt)

    @staticmethod
    def to_policy(q: np.ndarray) -> np.ndarray:
        """Joint positions -> the policy's units: the same here (radians)."""
        return np.asarray(q, dtype=np.float64)

    @staticmethod
    def from_policy(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float64)

    def reset(self, rng: np.random.Generator, keep_pose: bool = False) -> dict:
        """Start an episode on a new layout; ``keep_pose`` starts from where the arm is (no teleport)."""
        start = self.q.copy() if keep_pose else None
        self.scene = sample_scene(rng, self.arm, self.task, start)
        self.q = np.asarray(self.scene.start, dtype=np.float64)
        self.steps = 0
        self.success = False
        return self.observation()

    def drive(self, target: np.ndarray | None, seconds: float) -> None:
        """Drive the joints toward ``target`` for ``seconds`` at the motors' maximum velocity (None: hold)."""
        if target is not None:
            target = self.arm.clip(np.asarray(target, dtype=np.float64))
            limit = self.arm.max_velocity * seconds
            self.q = self.arm.clip(self.q + np.clip(target - self.q, -limit, limit))
        if self.scene is not None:
            self.success = self.success or self.is_touching()

    def step(self, action: np.ndarray) -> tuple[dict, bool, bool]:
        """Apply one action (J,) for one tick -> (observation, success, done)."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.arm.num_joints,) or not np.all(np.isfinite(action)):
            raise ValueError(f"action must be {self.arm.num_joints} finite joint positions, got {action}")
        self.drive(action, self.dt)
        self.steps += 1
        return self.observation(), self.success, self.success or self.steps >= self.max_steps

    def is_touching(self) -> bool:
        return touched(self._scene(), self.arm.tip(self.q), self.task)

    def render(self) -> np.ndarray:
        """Render the top camera's image (H, W, 3) uint8."""
        return self.camera.render(self._scene(), self.arm.joint_points(self.q), self.task.block_half_size)

    def observation(self) -> dict:
        """Return what the policy gets: the camera image, the joint positions and the instruction."""
        scene = self._scene()
        return {"images": {self.camera_name: self.render()}, "state": self.q.astype(np.float32),
                "task": scene.instruction}

    def close(self) -> None:
        """Release nothing: the numpy camera holds no resources (the contract's ``close``)."""

    def _scene(self) -> Scene:
        if self.scene is None:
            raise RuntimeError("call reset() first")
        return self.scene
