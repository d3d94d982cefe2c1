# SPDX-License-Identifier: Apache-2.0
"""
The planar arm's table-top task: coloured blocks placed at random, an instruction naming one, its success check.

"touch the red block" succeeds once the arm's tip is within ``touch_radius`` of the
red block's centre. Blocks are placed where the arm can reach them, apart from each
other and away from the base, so the expert always has a solution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_policy_node.sim.planar.arm import PlanarArm
from vla_policy_node.sim.scene import Block, COLOURS, Scene


@dataclass(frozen=True)
class TaskConfig:
    """Where blocks may lie and what counts as touching one."""

    num_blocks: int = 3
    block_half_size: float = 0.05
    min_radius: float = 0.30            # block distance from the base
    max_radius: float = 0.62
    min_bearing: float = np.deg2rad(25.0)
    max_bearing: float = np.deg2rad(155.0)
    min_separation: float = 0.16        # between block centres, and from the arm's tip at the start
    touch_radius: float = 0.06          # tip to target centre (the tip, r 0.022, then overlaps the block)

    def __post_init__(self) -> None:
        if not 1 <= self.num_blocks <= len(COLOURS):
            raise ValueError(f"num_blocks must be in 1..{len(COLOURS)}, got {self.num_blocks}")


def sample_scene(rng: np.random.Generator, arm: PlanarArm, config: TaskConfig = TaskConfig(),
                 start: np.ndarray | None = None) -> Scene:
    """Draw block colours, positions and the target; ``start`` None draws a start pose too."""
    if start is None:
        start = sample_start(rng, arm)
    tip = arm.tip(start)
    colours = rng.choice(sorted(COLOURS), size=config.num_blocks, replace=False)
    positions: list[np.ndarray] = []
    while len(positions) < config.num_blocks:
        r = rng.uniform(config.min_radius, config.max_radius)
        a = rng.uniform(config.min_bearing, config.max_bearing)
        p = np.array([r * np.cos(a), r * np.sin(a)])
        if np.linalg.norm(p - tip) >= config.min_separation and all(
                np.linalg.norm(p - other) >= config.min_separation for other in positions):
            positions.append(p)
    blocks = tuple(Block(str(c), (float(p[0]), float(p[1]))) for c, p in zip(colours, positions))
    return Scene(blocks=blocks, target=str(rng.choice(colours)), start=tuple(float(v) for v in start))


def sample_start(rng: np.random.Generator, arm: PlanarArm) -> np.ndarray:
    """Draw a start pose: the tip somewhere over the table, as a previous episode may have left it."""
    config = TaskConfig()
    r = rng.uniform(config.min_radius, config.max_radius)
    a = rng.uniform(np.deg2rad(10.0), np.deg2rad(170.0))
    return arm.ik(np.array([r * np.cos(a), r * np.sin(a)]))


def touched(scene: Scene, tip: np.ndarray, config: TaskConfig = TaskConfig()) -> bool:
    """Whether the tip (x, y) touches the target block."""
    return float(np.linalg.norm(np.asarray(tip) - scene.target_position)) <= config.touch_radius
