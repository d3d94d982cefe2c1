# SPDX-License-Identifier: Apache-2.0
"""
A LeRobotDataset's camera videos decoded with PyAV, frame for frame as LeRobot 0.6.1 reads them.

LeRobot's PyAV path seeks to the keyframe at or before the first wanted time, decodes forward,
and for each wanted time (the episode's ``from_timestamp`` + the frame's ``timestamp``) takes the
decoded frame whose pts is nearest, refusing one further than its tolerance (1e-4 s), converted
with ``to_ndarray(format="rgb24")``. This module does the same, one pass per episode and camera,
so its frames equal LeRobot's bit for bit (test/dataset/test_reader.py). PyAV's wheel bundles
FFmpeg with dav1d and libaom (AV1, LeRobot's default) and H.264.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

TOLERANCE_S = 1e-4     # LeRobotDataset's default tolerance_s


class VideoError(ValueError):
    """A video that cannot be decoded at the wanted times; the message names the file."""


def decodable(codec: str) -> bool:
    """Tell whether this PyAV build decodes ``codec`` (``av1``, ``h264``, ...)."""
    import av
    try:
        av.codec.Codec(codec, 'r')
    except Exception:  # noqa: B902 - PyAV raises several kinds for an unknown name
        return False
    return True


def decode_at(path: Path, times: Sequence[float], tolerance_s: float = TOLERANCE_S) -> np.ndarray:
    """
    Return the frames (N, H, W, 3) uint8 of ``path`` nearest each time in ``times`` (seconds).

    VideoError (naming the file) if it is missing, cannot be decoded, or has no frame within
    ``tolerance_s`` of a wanted time.
    """
    import av
    wanted = np.asarray(times, dtype=np.float64)
    if not path.is_file():
        raise VideoError(f'{path}: missing (the dataset lists a video there)')
    best = np.full(len(wanted), np.inf)            # per wanted time: the nearest decoded frame so far
    chosen: list = [None] * len(wanted)
    stamps = np.full(len(wanted), np.nan)
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            container.seek(round(float(wanted.min()) / stream.time_base) - 1, backward=True, any_frame=False,
                           stream=stream)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                stamp = float(frame.pts * stream.time_base)
                nearer = np.abs(wanted - stamp) < best     # strictly: the first of equals wins, as argmin
                if nearer.any():
                    image = frame.to_ndarray(format='rgb24')
                    for i in np.flatnonzero(nearer):
                        chosen[i] = image
                    best[nearer], stamps[nearer] = np.abs(wanted - stamp)[nearer], stamp
                if stamp >= wanted.max():
                    break
    except (av.error.FFmpegError, IndexError, ValueError) as error:
        raise VideoError(f'{path}: cannot be decoded ({type(error).__name__}: {_first_line(error)})') from None
    if any(image is None for image in chosen):
        raise VideoError(f'{path}: no frame decoded between {wanted.min():.4f} s and {wanted.max():.4f} s')
    if np.any(best >= tolerance_s):
        worst = int(best.argmax())
        raise VideoError(f'{path}: no frame within {tolerance_s} s of {wanted[worst]:.4f} s (nearest at '
                         f'{stamps[worst]:.4f} s): the video and the table disagree')
    return np.stack(chosen)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [''])[0][:200]
