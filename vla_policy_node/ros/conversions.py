# SPDX-License-Identifier: Apache-2.0
"""
ROS messages <-> numpy: camera images, instructions and joint commands (joint states: control.observations).

Everything that crosses the ROS boundary is checked here, and every rejection raises
:class:`ConversionError` with a message a person can act on (the node logs it, rate-limited,
and sends no command). This module deliberately does not import torch: conversions are cheap
and run in subscription callbacks, the policy only sees validated numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
import unicodedata

from builtin_interfaces.msg import Duration, Time
import numpy as np
from sensor_msgs.msg import Image
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint


class ConversionError(ValueError):
    """A message could not be turned into policy input or a command; the message says why."""


def undecodable_is_an_error(decode: Callable[..., Any], *args: Any) -> Any:
    """
    Run the decoding of a raw (serialized) message; bytes that are not its type are a ConversionError.

    Camera and joint-state subscriptions take raw messages, so rclpy's own deserialization,
    which raises its own error type on garbage, runs in the node's callbacks.
    """
    try:
        return decode(*args)
    except Exception as error:  # noqa: B902 - rclpy's RMWError and whatever else a bad buffer provokes
        raise ConversionError(f'undecodable message: {type(error).__name__}: {str(error)[:200]}') from error


# encoding -> (channels, the slice of a pixel's channels that is R, G, B); mono8 is replicated.
# Slices are views, so a frame is copied once, into the contiguous result.
IMAGE_ENCODINGS = {
    'rgb8': (3, slice(None)),
    'bgr8': (3, slice(None, None, -1)),
    'rgba8': (4, slice(0, 3)),
    'bgra8': (4, slice(2, None, -1)),
    'mono8': (1, slice(None)),
}


def check_frame_size(width: int, height: int, expected: tuple[int, int] | None) -> None:
    """Refuse a frame whose declared (width, height) is not its camera's, before anything is decoded."""
    if expected is not None and (width, height) != tuple(expected):
        raise ConversionError(f'frame declares {width}x{height}, this camera sends {expected[0]}x{expected[1]}: '
                              'refused before decoding')


def image_to_rgb(msg: Image, max_pixels: int = 4096 * 4096,
                 expected: tuple[int, int] | None = None) -> np.ndarray:
    """
    Convert a ``sensor_msgs/Image`` to a contiguous uint8 RGB array of shape (H, W, 3).

    Rows may be padded (``step`` > width * channels); the padding is dropped. The data length
    must be exactly ``step * height``: anything else means a truncated or mislabelled frame.
    ``expected`` (width, height): the camera's frame size, when known.
    """
    encoding = msg.encoding.lower()
    if encoding not in IMAGE_ENCODINGS:
        raise ConversionError(
            f"unsupported image encoding '{msg.encoding}' "
            f"(supported: {', '.join(IMAGE_ENCODINGS)})")
    channels, rgb = IMAGE_ENCODINGS[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ConversionError(f'image has no pixels ({width}x{height})')
    check_frame_size(width, height, expected)
    if height * width > max_pixels:
        raise ConversionError(
            f'image is {width}x{height}, more than the {max_pixels} pixels accepted')
    row_bytes = width * channels
    if step < row_bytes:
        raise ConversionError(
            f'image step {step} is smaller than width * channels = {row_bytes} for {encoding}')
    if len(msg.data) != step * height:
        raise ConversionError(
            f'image data has {len(msg.data)} bytes, expected step * height = {step * height}')
    data = np.frombuffer(msg.data, dtype=np.uint8).reshape(height, step)     # a view of the message
    pixels = data[:, :row_bytes].reshape(height, width, channels)[:, :, rgb]
    if channels == 1:
        pixels = np.broadcast_to(pixels, (height, width, 3))
    return np.array(pixels, order='C')       # its own copy: the frame outlives the message


def stamp_seconds(stamp: Time) -> float | None:
    """Return a header stamp in seconds, or None for the zero stamp of an unstamped message."""
    if stamp.sec == 0 and stamp.nanosec == 0:
        return None
    return stamp.sec + stamp.nanosec * 1e-9


def rgb_to_image(rgb: np.ndarray, frame_id: str = '') -> Image:
    """Pack a uint8 (H, W, 3) RGB array into an rgb8 ``sensor_msgs/Image`` (used by the sim)."""
    array = np.ascontiguousarray(rgb, dtype=np.uint8)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ConversionError(f'expected an (H, W, 3) array, got shape {array.shape}')
    msg = Image()
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(array.shape[0]), int(array.shape[1])
    msg.encoding = 'rgb8'
    msg.step = msg.width * 3
    msg.data = array.tobytes()
    return msg


def instruction_text(text: str, max_length: int) -> str:
    """
    Validate a language instruction and return it stripped of surrounding whitespace.

    Empty, oversized, control-character-laden strings and format characters (a right-to-left
    override, zero-width characters: text that reads otherwise than it is) are refused: they
    would make the policy act on a task nobody meant to give it.
    """
    if len(text) > max_length:
        raise ConversionError(
            f'instruction has {len(text)} characters, more than max_instruction_length '
            f'= {max_length}')
    stripped = text.strip()
    if not stripped:
        raise ConversionError('instruction is empty')
    control = sorted({hex(ord(c)) for c in stripped
                      if unicodedata.category(c) in ('Cc', 'Cs') and c not in '\t\n'})
    if control:
        raise ConversionError(f'instruction contains control characters {control}')
    formats = sorted({f'U+{ord(c):04X}' for c in stripped if unicodedata.category(c) == 'Cf'})
    if formats:
        raise ConversionError(f'instruction contains format characters {formats} (bidirectional overrides, '
                              'zero-width characters): it would not read as it is')
    return stripped


# CDR encapsulations (the first two bytes of a serialized message): big and little endian,
# XCDR1 and XCDR2. A std_msgs/String is then a uint32 length (with the closing NUL) and the bytes.
_CDR_LITTLE_ENDIAN = {b'\x00\x01': True, b'\x00\x07': True, b'\x00\x00': False, b'\x00\x06': False}


def instruction_from_cdr(raw: bytes, max_length: int) -> str:
    """
    Decode a serialized ``std_msgs/String`` into a validated instruction (``instruction_text``).

    Read from the wire, not through rclpy: its C conversion ends a string at the first NUL, so
    ``pick<NUL>up`` from a C++ publisher would silently become ``pick``.
    """
    little = _CDR_LITTLE_ENDIAN.get(bytes(raw[:2]))
    if little is None or len(raw) < 8:
        raise ConversionError(f'instruction is not a serialized std_msgs/String ({len(raw)} bytes)')
    length = int.from_bytes(raw[4:8], 'little' if little else 'big')
    if length > len(raw) - 8:
        raise ConversionError(f'instruction declares {length} bytes but carries {len(raw) - 8}')
    data = bytes(raw[8:8 + length]).removesuffix(b'\x00')
    if b'\x00' in data:
        raise ConversionError(f'instruction contains a NUL character at byte {data.index(0)}: refused, '
                              'not cut there')
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as error:
        raise ConversionError(f'instruction is not valid UTF-8: {error}') from None
    return instruction_text(text, max_length)


def _duration(seconds: float) -> Duration:
    nanoseconds = int(round(seconds * 1e9))
    return Duration(sec=nanoseconds // 1_000_000_000, nanosec=nanoseconds % 1_000_000_000)


def chunk_to_joint_trajectory(actions: np.ndarray, joint_names: Sequence[str],
                              dt: float, velocities: np.ndarray | None = None) -> JointTrajectory:
    """
    Turn actions (T, J) into a ``JointTrajectory`` whose point i is reached at (i + 1) * dt.

    ``velocities`` (T, J), when given, fill each point's velocities (the controller then
    interpolates with splines, not linearly).

    Row 0 is the action of this control tick; the rows after it are the plan for the next
    ticks, so joint_trajectory_controller can interpolate between them and keeps moving
    sensibly if a tick's message is late.

    The header stamp stays zero, which joint_trajectory_controller reads as "start now"; that
    avoids any dependence on clock agreement between this node and the controller.
    """
    array = np.asarray(actions, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != len(joint_names):
        raise ConversionError(
            f'expected actions of shape (T, {len(joint_names)}), got {array.shape}')
    if not np.all(np.isfinite(array)):
        raise ConversionError('actions contain non-finite values')
    if not dt > 0.0:
        raise ConversionError(f'dt must be positive, got {dt}')
    if velocities is not None:
        velocities = np.asarray(velocities, dtype=np.float64)
        if velocities.shape != array.shape or not np.all(np.isfinite(velocities)):
            raise ConversionError(
                f'velocities must be finite and of shape {array.shape}, got {velocities.shape}')
    msg = JointTrajectory()
    msg.joint_names = list(joint_names)
    for i, row in enumerate(array):
        point = JointTrajectoryPoint()
        point.positions = row.tolist()
        if velocities is not None:
            point.velocities = velocities[i].tolist()
        point.time_from_start = _duration((i + 1) * dt)
        msg.points.append(point)
    return msg


def action_to_float64_multiarray(action: np.ndarray) -> Float64MultiArray:
    """Turn one action (J,) into the ``Float64MultiArray`` forward_command_controller expects."""
    array = np.asarray(action, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(array)):
        raise ConversionError('action contains non-finite values')
    msg = Float64MultiArray()
    msg.layout.dim.append(MultiArrayDimension(label='joints', size=array.size, stride=array.size))
    msg.data = array.tolist()
    return msg
