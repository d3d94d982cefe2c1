# SPDX-License-Identifier: Apache-2.0
"""
The simulated robots by name, ``so101`` (the SO-101 in MuJoCo, the demo's) and ``planar``, and their contract.

``planar`` is the 3-joint numpy arm: no physics, renders in microseconds, so the unit and
DDS tests of the node's execution run on it fast; users meet the SO-101. Both keep one
contract, :class:`SimEnv` (Gymnasium's names where it has them: ``reset``, ``step``,
``render``, ``close``, ``dt``), which training, the rollouts and the ROS robot use.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from vla_policy_node.sim.scene import Scene

ROBOTS = ("so101", "planar")


@runtime_checkable
class SimEnv(Protocol):
    """
    One simulated robot on the table-top task, its joints in radians as on ``/joint_states``.

    An observation is ``{"images": {camera_name: (H, W, 3) uint8}, "state": (J,) float32,
    "task": instruction}``. ``step`` runs one control tick of ``dt`` seconds; ``drive`` runs
    physics for any time (the ROS robot's controllers); ``success`` latches once the named
    block was touched since ``reset``.
    """

    dt: float                               # s per control tick
    max_steps: int                          # ticks before an episode counts as failed
    joint_names: tuple[str, ...]
    camera_name: str
    scene: Scene | None                     # None before the first reset
    steps: int                              # ticks of this episode so far
    success: bool

    @property
    def num_joints(self) -> int: ...
    @property
    def image_size(self) -> int: ...
    @property
    def q(self) -> np.ndarray: ...

    def reset(self, rng: np.random.Generator, keep_pose: bool = False) -> dict:
        """Start an episode on a new layout (``keep_pose``: from where the arm is) -> the observation."""
    def step(self, action: np.ndarray) -> tuple[dict, bool, bool]:
        """Command joint positions (J,) for one tick -> (observation, success, done)."""
    def drive(self, target: np.ndarray | None, seconds: float) -> None:
        """Drive the joints toward ``target`` for ``seconds`` (None: keep the last target)."""
    def render(self) -> np.ndarray:
        """Render the camera's image (H, W, 3) uint8."""
    def observation(self) -> dict:
        """Return what the policy gets now."""
    def is_touching(self) -> bool:
        """Whether the arm touches the named block now."""
    def expert(self) -> Any:
        """Return the scripted expert that records demonstrations on this robot."""
    def to_policy(self, q: np.ndarray) -> np.ndarray:
        """Convert joint positions to the policy's units."""
    def from_policy(self, a: np.ndarray) -> np.ndarray:
        """Convert the policy's actions to joint positions."""
    def close(self) -> None:
        """Release what the robot holds (the SO-101: its renderer)."""


def make_env(robot: str, *, dt: float | None = None, max_steps: int | None = None) -> SimEnv:
    """Return a new environment of ``robot``; ``dt`` and ``max_steps`` default to the robot's own."""
    options: dict[str, Any] = {key: value for key, value in (("dt", dt), ("max_steps", max_steps))
                               if value is not None}
    if robot == "so101":
        from vla_policy_node.sim.so101.env import So101TouchEnv      # imports MuJoCo
        return So101TouchEnv(**options)
    if robot == "planar":
        from vla_policy_node.sim.planar.env import TouchEnv
        return TouchEnv(**options)
    raise ValueError(f"unknown simulated robot {robot!r}: one of {', '.join(ROBOTS)}")
