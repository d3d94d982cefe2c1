# SPDX-License-Identifier: Apache-2.0
"""
``sensor_msgs/CompressedImage`` (jpeg, png) <-> uint8 RGB, as image_transport's ``compressed``.

image_transport's ``compressed`` plugin publishes on ``<base topic>/compressed`` with
``format`` = ``"<raw encoding>; <jpeg|png> compressed <target>"``: colour images are
converted to ``bgr8`` (``bgr16`` for 16-bit png) before OpenCV encodes them, so the file holds
the true colours and the format reads e.g. ``"rgb8; jpeg compressed bgr8"``; mono images
give ``"mono8; jpeg compressed "``. Older publishers and some drivers write just ``"jpeg"`` or
``"png"``. A colour format whose target is not ``bgr`` (raw RGB bytes handed to OpenCV) holds
swapped channels, which are swapped back, as the plugin's own subscriber does.

Decoded with Pillow (libjpeg-turbo and zlib underneath): it decodes straight to RGB, reads
the size from the header before decoding (so an oversized frame is refused without
allocating it), and its wheel is a few MiB, where OpenCV's is ~50 MiB (and matplotlib, used
by the replay plot, depends on Pillow anyway). Only 8-bit images are accepted, like the raw
path; ``compressedDepth`` (16-bit depth) is refused.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage

from vla_policy_node.ros.conversions import check_frame_size, ConversionError

CODECS = {'jpeg': 'JPEG', 'jpg': 'JPEG', 'png': 'PNG'}     # format word -> Pillow's name
TRANSPORT_SUFFIX = '/compressed'
_COLOR_ENCODINGS = ('rgb8', 'bgr8', 'rgba8', 'bgra8')


def camera_topic(topic: str, transport: str) -> str:
    """Return the topic to subscribe to: ``<topic>/compressed`` for the compressed transport."""
    if transport != 'compressed' or topic.rstrip('/').endswith(TRANSPORT_SUFFIX):
        return topic
    return topic.rstrip('/') + TRANSPORT_SUFFIX


def parse_format(text: str) -> tuple[str, bool]:
    """
    Return (codec: 'jpeg' | 'png', whether the channels are stored swapped) of a ``format``.

    Raises ConversionError for anything else (tiff, compressedDepth, 16-bit, an unknown word).
    """
    raw, sep, rest = text.partition(';')
    words = (rest if sep else raw).lower().split()
    codec = next((word for word in words if word in CODECS), None)
    if codec is None or 'compresseddepth' in words:
        raise ConversionError(
            f"unsupported compressed image format '{text}' (supported: jpeg and png, as "
            "image_transport's compressed transport publishes them)")
    if not sep:
        return ('png' if codec == 'png' else 'jpeg'), False
    encoding = raw.strip().lower()
    target = words[words.index('compressed') + 1] if 'compressed' in words[:-1] else ''
    if encoding.endswith('16') or target.endswith('16'):
        raise ConversionError(f"compressed image format '{text}' is 16-bit; only 8-bit images are accepted")
    swapped = encoding in _COLOR_ENCODINGS and bool(target) and not target.startswith('bgr')
    return ('png' if codec == 'png' else 'jpeg'), swapped


def compressed_to_rgb(msg: CompressedImage, max_pixels: int = 4096 * 4096,
                      expected: tuple[int, int] | None = None) -> np.ndarray:
    """
    Decode a jpeg or png ``CompressedImage`` to a contiguous uint8 RGB array (H, W, 3).

    The size is read from the file's header first (Pillow opens lazily): a frame over
    ``max_pixels``, or not of ``expected`` (width, height), the camera's size when known, is
    refused before decoding; a 1.7 KB JPEG declaring 4096x4096 costs nothing.
    """
    codec, swapped = parse_format(msg.format)
    if len(msg.data) == 0:
        raise ConversionError('compressed image has no data')
    # Pillow's decoders raise more than OSError on hostile bytes (SyntaxError for a broken PNG
    # chunk, struct.error, EOFError): any of them is a bad message, never a crash.
    try:
        image = PILImage.open(io.BytesIO(msg.data), formats=[CODECS[codec]])
    except Exception as error:
        raise ConversionError(f'compressed image is not a valid {codec}: {error}') from error
    width, height = image.size
    if height * width > max_pixels:
        raise ConversionError(f'image is {width}x{height}, more than the {max_pixels} pixels accepted')
    check_frame_size(width, height, expected)
    if image.mode not in ('RGB', 'L', 'RGBA', 'LA', 'P', '1'):
        raise ConversionError(f'compressed image has pixel mode {image.mode}; only 8-bit '
                              'grey, RGB and RGBA are accepted')
    try:
        rgb = np.asarray(image.convert('RGB') if image.mode != 'RGB' else image, dtype=np.uint8)
    except Exception as error:
        raise ConversionError(f'compressed image could not be decoded: {error}') from error
    if swapped:
        rgb = rgb[:, :, ::-1]
    return np.require(rgb, requirements=['C', 'W'])     # Pillow's buffer is read-only: one copy


def rgb_to_compressed(rgb: np.ndarray, codec: str = 'jpeg', quality: int = 90) -> CompressedImage:
    """Encode uint8 RGB (H, W, 3) as image_transport's compressed plugin would an rgb8 image."""
    array = np.ascontiguousarray(rgb, dtype=np.uint8)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ConversionError(f'expected an (H, W, 3) array, got shape {array.shape}')
    if codec not in ('jpeg', 'png'):
        raise ConversionError(f"codec must be jpeg or png, got '{codec}'")
    stream = io.BytesIO()
    PILImage.fromarray(array, 'RGB').save(stream, format=CODECS[codec], quality=quality)
    return CompressedImage(format=f'rgb8; {codec} compressed bgr8', data=stream.getvalue())
