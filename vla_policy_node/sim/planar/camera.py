# SPDX-License-Identifier: Apache-2.0
"""
A top camera over the table, rendered with numpy: what the policy sees.

The 48 x 48 image covers x in [-0.64, 0.64] and y in [-0.08, 0.72] (metres; pixels are
2.7 cm wide and 1.7 cm high), +y up in the image, so the arm's base is at the bottom
centre. Blocks are filled squares in their colour; the arm is drawn over them as dark links
with a white tip, as a camera above sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vla_policy_node.sim.scene import COLOURS, Scene

TABLE_RGB = (190, 180, 160)
ARM_RGB = (50, 50, 50)
TIP_RGB = (255, 255, 255)


@dataclass(frozen=True)
class TopCamera:
    """Pixel grid of the top view; ``render`` is pure and deterministic."""

    height: int = 48
    width: int = 48
    x_range: tuple[float, float] = (-0.64, 0.64)
    y_range: tuple[float, float] = (-0.08, 0.72)
    link_half_width: float = 0.02       # at least half a pixel diagonal: no gaps in the links
    tip_radius: float = 0.022

    def __post_init__(self) -> None:
        if self.height < 8 or self.width < 8:
            raise ValueError(f"image must be at least 8x8, got {self.height}x{self.width}")

    def pixel_centres(self) -> tuple[np.ndarray, np.ndarray]:
        """World (x, y) of every pixel centre, each (H, W)."""
        cols = (np.arange(self.width) + 0.5) / self.width
        rows = (np.arange(self.height) + 0.5) / self.height
        x = self.x_range[0] + cols * (self.x_range[1] - self.x_range[0])
        y = self.y_range[1] - rows * (self.y_range[1] - self.y_range[0])
        return np.broadcast_to(x[None, :], (self.height, self.width)), \
            np.broadcast_to(y[:, None], (self.height, self.width))

    def render(self, scene: Scene, joint_points: np.ndarray, half_size: float) -> np.ndarray:
        """Scene plus arm (its ``joint_points`` (J + 1, 2)) -> uint8 RGB (H, W, 3)."""
        x, y = self.pixel_centres()
        image = np.empty((self.height, self.width, 3), np.uint8)
        image[:] = TABLE_RGB
        for block in scene.blocks:
            inside = (np.abs(x - block.position[0]) <= half_size) & (np.abs(y - block.position[1]) <= half_size)
            image[inside] = COLOURS[block.colour]
        for a, b in zip(joint_points[:-1], joint_points[1:]):
            image[_segment_distance(x, y, a, b) <= self.link_half_width] = ARM_RGB
        tip = joint_points[-1]
        image[np.hypot(x - tip[0], y - tip[1]) <= self.tip_radius] = TIP_RGB
        return image


def _segment_distance(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance of every point (x, y) to the segment a-b."""
    d = b - a
    t = np.clip(((x - a[0]) * d[0] + (y - a[1]) * d[1]) / max(float(d @ d), 1e-12), 0.0, 1.0)
    return np.hypot(x - (a[0] + t * d[0]), y - (a[1] + t * d[1]))
