# SPDX-License-Identifier: Apache-2.0
"""
An episode's scene, shared by both simulated robots: blocks on the table and the one to touch.

The colours' RGB values are the planar arm's camera's; the SO-101 has its own materials.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 190, 40),
    "blue": (40, 60, 230),
    "yellow": (235, 210, 20),
}
INSTRUCTION = "touch the {colour} block"


@dataclass(frozen=True)
class Block:
    """A square block lying on the table."""

    colour: str
    position: tuple[float, float]      # centre (x, y), metres


@dataclass(frozen=True)
class Scene:
    """One episode's layout and task."""

    blocks: tuple[Block, ...]
    target: str                         # colour of the block to touch
    start: tuple[float, ...]            # joint positions the episode starts from

    @property
    def instruction(self) -> str:
        return INSTRUCTION.format(colour=self.target)

    def block(self, colour: str) -> Block:
        for b in self.blocks:
            if b.colour == colour:
                return b
        raise ValueError(f"no {colour} block in this scene; it has {[b.colour for b in self.blocks]}")

    @property
    def target_position(self) -> np.ndarray:
        return np.asarray(self.block(self.target).position)
