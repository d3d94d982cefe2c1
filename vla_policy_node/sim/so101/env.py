# SPDX-License-Identifier: Apache-2.0
"""
So101TouchEnv: the SO-101 in MuJoCo over three coloured blocks, the front camera, the touch task.

Commands are joint positions in radians for the six position actuators (the STS3215 servo
model of the MJCF: kp 17.8, force limited), so the arm follows with lag, sags under gravity,
collides with itself, the table and the blocks, and pushes blocks it hits. An episode
succeeds when the gripper (either jaw) touches the named block. ``step`` runs one control
tick; ``drive`` runs physics for any time (the ROS robot calls it at its physics rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from vla_policy_node.sim.so101 import ASSETS
from vla_policy_node.sim.so101.expert import So101Expert
from vla_policy_node.sim.so101.kinematics import Kinematics
from vla_policy_node.sim.so101.units import JOINT_NAMES, to_lerobot, to_ros
from vla_policy_node.sim.scene import Block, Scene

CAMERA_NAME = "front"
BLOCK_COLOURS = ("blue", "green", "purple", "red")   # no yellow: the arm is yellow
TOUCH_CHECK_EVERY = 5                # physics steps (10 ms) between contact checks


@dataclass(frozen=True)
class So101Task:
    """Where blocks lie (m, in front of the arm) and where episodes may start."""

    num_blocks: int = 3
    x: tuple[float, float] = (0.14, 0.30)
    y: tuple[float, float] = (-0.15, 0.15)
    min_separation: float = 0.08        # between block centres, and from the tip at the start
    start_x: tuple[float, float] = (0.12, 0.28)
    start_y: tuple[float, float] = (-0.16, 0.16)
    start_z: tuple[float, float] = (0.08, 0.16)

    def __post_init__(self) -> None:
        if not 1 <= self.num_blocks <= len(BLOCK_COLOURS):
            raise ValueError(f"num_blocks must be in 1..{len(BLOCK_COLOURS)}, got {self.num_blocks}")


@dataclass
class So101TouchEnv:
    """One simulated SO-101; ``reset`` starts an episode, ``step`` runs one control tick."""

    dt: float = 1.0 / 30.0              # s per control tick (LeRobot's SO-101 datasets: 30 fps)
    max_steps: int = 90
    image_size: int = 64
    task: So101Task = field(default_factory=So101Task)
    joint_names: tuple[str, ...] = JOINT_NAMES
    camera_name: str = CAMERA_NAME

    def __post_init__(self) -> None:
        if tuple(self.joint_names) != JOINT_NAMES:
            raise ValueError(f"the SO-101's joints are {JOINT_NAMES}, got {self.joint_names}")
        self.model = mujoco.MjModel.from_xml_path(str(ASSETS / "touch_scene.xml"))
        self.data = mujoco.MjData(self.model)
        self.kinematics = Kinematics(self.model)
        self.lower = self.model.actuator_ctrlrange[:6, 0].copy()
        self.upper = self.model.actuator_ctrlrange[:6, 1].copy()
        self._arm_qpos = np.array([self.model.jnt_qposadr[self.model.joint(n).id] for n in JOINT_NAMES])
        self._jaws = (self.model.body("gripper").id, self.model.body("moving_jaw_so101_v1").id)
        self._block_bodies = {colour: self.model.body(colour).id for colour in BLOCK_COLOURS}
        self.block_half_size = float(self.model.geom("red").size[0])
        self._renderer: mujoco.Renderer | None = None
        self._substeps_owed = 0.0
        self.scene: Scene | None = None
        self.steps = 0
        self.success = False

    # ------------------------------------------------------------------ what the robot is
    @property
    def num_joints(self) -> int:
        return len(JOINT_NAMES)

    @property
    def q(self) -> np.ndarray:
        """Measured joint positions (6,) in radians."""
        return self.data.qpos[self._arm_qpos].copy()

    def expert(self) -> So101Expert:
        return So101Expert(self.kinematics, self.dt, block_top=2 * self.block_half_size)

    @staticmethod
    def to_policy(q: np.ndarray) -> np.ndarray:
        """Joint positions in radians -> the policy's units (LeRobot's SO-101 degrees, gripper 0..100)."""
        return to_lerobot(q)

    @staticmethod
    def from_policy(a: np.ndarray) -> np.ndarray:
        return to_ros(a)

    # ------------------------------------------------------------------ episodes
    def reset(self, rng: np.random.Generator, keep_pose: bool = False) -> dict:
        """Start an episode on a new layout; ``keep_pose`` starts from where the arm is (no teleport)."""
        if not keep_pose or self.scene is None:
            self._set_arm(self._sample_start(rng))
        mujoco.mj_forward(self.model, self.data)
        tip = self.kinematics.tip(self.q)[:2]
        colours = rng.choice(BLOCK_COLOURS, size=self.task.num_blocks, replace=False)
        positions: list[np.ndarray] = []
        while len(positions) < self.task.num_blocks:
            p = np.array([rng.uniform(*self.task.x), rng.uniform(*self.task.y)])
            if all(np.linalg.norm(p - other) >= self.task.min_separation for other in [tip, *positions]):
                positions.append(p)
        blocks = tuple(Block(str(c), (float(p[0]), float(p[1]))) for c, p in zip(colours, positions))
        scene = Scene(blocks=blocks, target=str(rng.choice(colours)), start=tuple(float(v) for v in self.q))
        return self._begin(scene)

    def step(self, action: np.ndarray) -> tuple[dict, bool, bool]:
        """Command joint positions (6,) in radians for one tick -> (observation, success, done)."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.num_joints,) or not np.all(np.isfinite(action)):
            raise ValueError(f"action must be {self.num_joints} finite joint positions, got {action}")
        self.drive(action, self.dt)
        self.steps += 1
        return self.observation(), self.success, self.success or self.steps >= self.max_steps

    def drive(self, target: np.ndarray | None, seconds: float) -> None:
        """Run physics for ``seconds`` with the actuators set to ``target`` (6,) radians (None: keep the last)."""
        if target is not None:
            self.data.ctrl[:6] = np.clip(target, self.lower, self.upper)
        self._substeps_owed += seconds / self.model.opt.timestep
        substeps = int(self._substeps_owed)
        self._substeps_owed -= substeps
        for i in range(substeps):
            mujoco.mj_step(self.model, self.data)
            if self.scene is not None and (i % TOUCH_CHECK_EVERY == 0 or i == substeps - 1):
                self.success = self.success or self.is_touching()

    def is_touching(self) -> bool:
        """Whether a jaw touches the named block now (over all contacts at once: it runs every 10 ms)."""
        contacts = self.data.contact[:self.data.ncon]
        first, second = self.model.geom_bodyid[contacts.geom1], self.model.geom_bodyid[contacts.geom2]
        (jaw, moving_jaw), block = self._jaws, self._block_bodies[self._scene().target]
        return bool(np.any(((first == block) & ((second == jaw) | (second == moving_jaw)))
                           | ((second == block) & ((first == jaw) | (first == moving_jaw)))))

    # ------------------------------------------------------------------ the camera
    def render(self) -> np.ndarray:
        """Render the front camera's image (H, W, 3) uint8."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.image_size, self.image_size)
        self._renderer.update_scene(self.data, camera=self.camera_name)
        return self._renderer.render().copy()

    def observation(self) -> dict:
        """Return what the policy gets: the camera image, the joint positions (radians) and the instruction."""
        return {"images": {self.camera_name: self.render()}, "state": self.q.astype(np.float32),
                "task": self._scene().instruction}

    def close(self) -> None:
        """Release the MuJoCo renderer (its GL context); ``render`` makes a new one if called again."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ------------------------------------------------------------------ internals
    def _sample_start(self, rng: np.random.Generator) -> np.ndarray:
        """Draw a pose with the tip somewhere over the table, as a previous episode may have left it."""
        t = self.task
        point = np.array([rng.uniform(*t.start_x), rng.uniform(*t.start_y), rng.uniform(*t.start_z)])
        return self.kinematics.solve(point, gripper=self.lower[5])

    def _set_arm(self, q: np.ndarray) -> None:
        self.data.qpos[self._arm_qpos] = q
        self.data.qvel[:] = 0.0
        self.data.ctrl[:6] = q

    def _begin(self, scene: Scene) -> dict:
        """Put the scene's blocks on the table (the others far off it) and start counting."""
        on_table = {b.colour: b.position for b in scene.blocks}
        for i, colour in enumerate(BLOCK_COLOURS):
            x, y = on_table.get(colour, (2.0 + i, 2.0))
            address = self.model.jnt_qposadr[self.model.joint(colour).id]
            self.data.qpos[address:address + 7] = (x, y, self.block_half_size, 1.0, 0.0, 0.0, 0.0)
        self.data.qvel[6:] = 0.0
        self.data.ctrl[:6] = self.q
        mujoco.mj_forward(self.model, self.data)
        self.scene = scene
        self.steps = 0
        self.success = False
        return self.observation()

    def _scene(self) -> Scene:
        if self.scene is None:
            raise RuntimeError("call reset() first")
        return self.scene
