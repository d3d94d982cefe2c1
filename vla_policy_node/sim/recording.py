# SPDX-License-Identifier: Apache-2.0
"""Saving an episode for a person to look at: an animated GIF and a PNG strip of frames (Pillow), captioned."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def upscale(frame: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement of an (H, W, 3) frame."""
    return np.repeat(np.repeat(frame, factor, axis=0), factor, axis=1)


def captioned(frame: np.ndarray, caption: str | None) -> np.ndarray:
    """Return the frame with ``caption`` (lines split at newlines) in black on a white band under it."""
    if not caption:
        return frame
    from PIL import Image, ImageDraw

    lines = caption.split("\n")
    band = Image.new("RGB", (frame.shape[1], 12 * len(lines) + 4), "white")
    draw = ImageDraw.Draw(band)
    for i, line in enumerate(lines):
        draw.text((3, 2 + 12 * i), line, fill="black")
    return np.concatenate([frame, np.asarray(band)], axis=0)


def save_strip(frames: Sequence[np.ndarray], path: Path, columns: int = 8, factor: int = 3,
               captions: Sequence[str] | None = None) -> None:
    """Up to ``columns`` frames, evenly picked (first and last included), side by side in one PNG."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to save")
    picks = np.unique(np.linspace(0, len(frames) - 1, min(columns, len(frames))).round().astype(int))
    tiles = [captioned(upscale(frames[i], factor), captions[i] if captions else None) for i in picks]
    gap = np.full((tiles[0].shape[0], 2, 3), 255, np.uint8)
    row = np.concatenate([np.concatenate([tile, gap], axis=1) for tile in tiles], axis=1)
    Image.fromarray(row[:, :-2]).save(path)


def save_gif(frames: Sequence[np.ndarray], path: Path, seconds_per_frame: float, factor: int = 4,
             captions: Sequence[str] | None = None) -> None:
    """All frames as an animated GIF that loops, each with its caption (if given) under it."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to save")
    if captions is not None and len(captions) != len(frames):
        raise ValueError(f"{len(captions)} captions for {len(frames)} frames")
    images = [Image.fromarray(captioned(upscale(f, factor), captions[i] if captions else None))
              for i, f in enumerate(frames)]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 * seconds_per_frame), loop=0)
