# SPDX-License-Identifier: Apache-2.0
"""Saving an episode for a person to look at: an animated GIF and a PNG strip of frames (Pillow)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def upscale(frame: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement of an (H, W, 3) frame."""
    return np.repeat(np.repeat(frame, factor, axis=0), factor, axis=1)


def save_strip(frames: Sequence[np.ndarray], path: Path, columns: int = 8, factor: int = 3) -> None:
    """Up to ``columns`` frames, evenly picked (first and last included), side by side in one PNG."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to save")
    picks = np.unique(np.linspace(0, len(frames) - 1, min(columns, len(frames))).round().astype(int))
    gap = np.full((frames[0].shape[0] * factor, 2, 3), 255, np.uint8)
    row = np.concatenate([np.concatenate([upscale(frames[i], factor), gap], axis=1) for i in picks], axis=1)
    Image.fromarray(row[:, :-2]).save(path)


def save_gif(frames: Sequence[np.ndarray], path: Path, seconds_per_frame: float, factor: int = 4) -> None:
    """All frames as an animated GIF that loops."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to save")
    images = [Image.fromarray(upscale(f, factor)) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 * seconds_per_frame), loop=0)
