# SPDX-License-Identifier: Apache-2.0
"""
Demonstrations from the scripted expert: (image, joints, instruction) -> the expert's next action chunk.

Episodes run back to back as on the ROS robot: half start where the previous one ended,
half from a random pose. The executed actions get a little Gaussian noise (DART-style),
so the data covers states slightly off the expert's path, while every label is the
clean expert plan from the state actually visited. A few hold steps after the touch
teach the policy to stay on the block.

Every visited state is recorded once per block on the table, each time with that
block's instruction and the expert's plan toward it (instruction relabelling). The
image and joints then say nothing about which block is wanted, so only the
instruction can: without it, a small policy learns "reach the block the arm is
already heading for" and picks the wrong one on a third of unseen layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from vla_policy_node.sim.scene import INSTRUCTION, Scene


@dataclass(frozen=True)
class Demonstrations:
    """N training samples, joints in the policy's units (the SO-101's: LeRobot's degrees, gripper 0..100)."""

    images: np.ndarray            # (N, H, W, 3) uint8, the camera
    states: np.ndarray            # (N, J) float32 joint positions
    actions: np.ndarray           # (N, chunk, J) float32 joint position targets
    instructions: tuple[str, ...]
    task_index: np.ndarray        # (N,) int, index into ``instructions``
    camera: str

    def __len__(self) -> int:
        return len(self.states)


def expert_plan(expert, scene: Scene, q: np.ndarray, chunk: int) -> np.ndarray:
    """Return the expert's next ``chunk`` commands from joints ``q`` (its motors reach each one in a tick)."""
    plan = np.empty((chunk, len(q)))
    for i in range(chunk):
        q = expert.action(scene, q)
        plan[i] = q
    return plan


def collect(env, episodes: int, chunk: int, seed: int, action_noise: float = 0.03,
            hold_steps: int = 5, progress: bool = True) -> Demonstrations:
    """Run the expert for ``episodes`` episodes; record every step once per block, the executed one first."""
    if episodes < 1 or chunk < 1:
        raise ValueError(f"episodes and chunk must be >= 1, got {episodes}, {chunk}")
    rng = np.random.default_rng(seed)
    expert = env.expert()
    images, states, actions, tasks = [], [], [], []
    instructions: dict[str, int] = {}
    for episode in tqdm(range(episodes), desc="demonstrations", disable=not progress, unit="ep"):
        obs = env.reset(rng, keep_pose=episode > 0 and rng.random() < 0.5)
        scene = env.scene
        relabelled = [scene, *(replace(scene, target=b.colour) for b in scene.blocks if b.colour != scene.target)]
        hold = 0
        while hold <= hold_steps and env.steps < env.max_steps:
            plans = [expert_plan(expert, target, env.q, chunk) for target in relabelled]
            for target, plan in zip(relabelled, plans):
                images.append(obs["images"][env.camera_name])
                states.append(env.to_policy(env.q).astype(np.float32))
                actions.append(env.to_policy(plan).astype(np.float32))
                tasks.append(instructions.setdefault(INSTRUCTION.format(colour=target.target), len(instructions)))
            plan = plans[0]
            noisy = plan[0] + rng.normal(0.0, action_noise, plan[0].shape) * (hold == 0)
            obs, success, _ = env.step(noisy)
            hold += success
    return Demonstrations(np.stack(images), np.stack(states), np.stack(actions),
                          tuple(sorted(instructions, key=instructions.get)), np.asarray(tasks), env.camera_name)
