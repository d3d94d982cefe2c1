# SPDX-License-Identifier: Apache-2.0
"""Compressed camera frames: image_transport's format strings, jpeg and png, and refusals."""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image as PILImage
import pytest
from sensor_msgs.msg import CompressedImage

from vla_policy_node.ros.compressed import camera_topic, compressed_to_rgb, parse_format, rgb_to_compressed
from vla_policy_node.ros.conversions import ConversionError

RGB = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)


def encoded(array: np.ndarray, codec: str, mode: str = 'RGB') -> bytes:
    stream = io.BytesIO()
    PILImage.fromarray(array, mode).save(stream, format=codec.upper(), quality=95)
    return stream.getvalue()


@pytest.mark.parametrize('text, expected', [
    ('rgb8; jpeg compressed bgr8', ('jpeg', False)),
    ('bgr8; jpeg compressed bgr8', ('jpeg', False)),
    ('bgra8; png compressed bgr8', ('png', False)),
    ('mono8; jpeg compressed ', ('jpeg', False)),
    ('rgb8; jpeg compressed rgb8', ('jpeg', True)),     # raw RGB bytes handed to OpenCV
    ('jpeg', ('jpeg', False)),                           # older publishers, drivers
    ('PNG', ('png', False)),
])
def test_image_transport_formats(text, expected):
    assert parse_format(text) == expected


@pytest.mark.parametrize('text', ['16UC1; compressedDepth png', 'bgr16; png compressed bgr16',
                                  'rgb8; tiff compressed bgr8', 'h264', ''])
def test_other_formats_are_refused(text):
    with pytest.raises(ConversionError):
        parse_format(text)


def test_png_is_lossless_and_the_colours_are_rgb():
    msg = CompressedImage(format='rgb8; png compressed bgr8', data=encoded(RGB, 'png'))
    out = compressed_to_rgb(msg)
    np.testing.assert_array_equal(out, RGB)
    assert out.flags.c_contiguous and out.dtype == np.uint8


def test_jpeg_decodes_close_to_the_source():
    smooth = np.broadcast_to(np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], (48, 64, 3))
    smooth = np.ascontiguousarray(smooth * np.array([1, 0, 0], np.uint8))     # a red ramp
    out = compressed_to_rgb(rgb_to_compressed(smooth, 'jpeg', quality=95))
    assert out.shape == (48, 64, 3)
    assert np.abs(out.astype(int) - smooth).mean() < 3.0
    assert out[:, :, 0].mean() > 100 and out[:, :, 2].mean() < 10, 'red stays red'


def test_swapped_channels_are_swapped_back():
    msg = CompressedImage(format='rgb8; png compressed rgb8', data=encoded(RGB[:, :, ::-1].copy(), 'png'))
    np.testing.assert_array_equal(compressed_to_rgb(msg), RGB)


def test_mono_is_replicated():
    grey = RGB[:, :, 0].copy()
    msg = CompressedImage(format='mono8; png compressed ', data=encoded(grey, 'png', 'L'))
    np.testing.assert_array_equal(compressed_to_rgb(msg), np.repeat(grey[:, :, None], 3, axis=2))


@pytest.mark.parametrize('format_, data, message', [
    ('rgb8; jpeg compressed bgr8', b'', 'compressed image has no data'),
    ('rgb8; jpeg compressed bgr8', b'not a jpeg', 'compressed image is not a valid jpeg'),
    ('rgb8; jpeg compressed bgr8', 'png', 'compressed image is not a valid jpeg'),
    ('rgb8; jpeg compressed bgr8', 'truncated', 'compressed image could not be decoded'),
])
def test_bad_data_is_refused_with_a_reason(format_, data, message):
    if data == 'png':
        data = encoded(RGB, 'png')
    elif data == 'truncated':
        whole = encoded(RGB, 'jpeg')
        data = whole[:len(whole) // 2]     # the header is whole, the scan is cut
    with pytest.raises(ConversionError, match=message):
        compressed_to_rgb(CompressedImage(format=format_, data=data))


def test_oversized_frames_are_refused_before_decoding():
    msg = rgb_to_compressed(RGB, 'png')
    with pytest.raises(ConversionError, match='image is 64x48, more than the 1000 pixels accepted'):
        compressed_to_rgb(msg, max_pixels=1000)


def test_the_topic_follows_image_transport():
    assert camera_topic('camera/front/image_raw', 'compressed') == 'camera/front/image_raw/compressed'
    assert camera_topic('camera/front/image_raw/compressed', 'compressed') == \
        'camera/front/image_raw/compressed'
    assert camera_topic('camera/front/image_raw', 'raw') == 'camera/front/image_raw'


def broken_png_chunk() -> bytes:
    """Return a PNG whose IDAT claims 22 bytes too few: the decoder reads a chunk type from pixel data."""
    data = bytearray(encoded(RGB, 'png'))
    at = 33                              # after the signature (8) and IHDR (25): IDAT's length
    assert data[at + 4:at + 8] == b'IDAT'
    data[at:at + 4] = struct.pack('>I', struct.unpack('>I', data[at:at + 4])[0] - 22)
    return bytes(data)


def test_a_broken_png_chunk_is_a_conversion_error_not_a_crash():
    with pytest.raises(SyntaxError):    # what Pillow itself raises, which once ended the node
        PILImage.open(io.BytesIO(broken_png_chunk())).load()
    with pytest.raises(ConversionError, match='compressed image'):
        compressed_to_rgb(CompressedImage(format='rgb8; png compressed bgr8', data=broken_png_chunk()))


@pytest.mark.parametrize('codec', ['png', 'jpeg'])
def test_any_corruption_of_a_frame_decodes_or_is_refused(codec):
    valid = encoded(RGB, codec)
    rng = np.random.default_rng(7)
    for _ in range(400):
        data = bytearray(valid)
        for position in rng.integers(0, len(data), rng.integers(1, 6)):
            data[position] = int(rng.integers(0, 256))
        cut = bytes(data[:rng.integers(8, len(data) + 1)])
        msg = CompressedImage(format=f'rgb8; {codec} compressed bgr8', data=cut)
        try:
            out = compressed_to_rgb(msg)
        except ConversionError:
            continue
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


def jpeg_declaring(width: int, height: int) -> bytes:
    """Return a small JPEG whose frame header (SOF0) declares ``width`` x ``height``: a decode bomb of a few KB."""
    data = bytearray(encoded(RGB, 'jpeg'))
    sof = data.find(b'\xff\xc0')
    struct.pack_into('>HH', data, sof + 5, height, width)
    return bytes(data)


@pytest.mark.parametrize('bomb', ['jpeg', 'png'])
def test_a_frame_declaring_another_size_than_its_camera_is_refused_before_decoding(bomb, monkeypatch):
    """A 1.7 KB JPEG declaring 4096x4096, or a 50 KB PNG that inflates to 4096x4096, costs no decoding."""
    if bomb == 'jpeg':
        data = jpeg_declaring(4096, 4096)
        assert len(data) < 8192
    else:
        data = encoded(np.zeros((4096, 4096, 3), np.uint8), 'png')
        assert len(data) < 200_000
    decoded = []
    monkeypatch.setattr(PILImage.Image, 'load', lambda self: decoded.append(self.size))
    msg = CompressedImage(format=f'rgb8; {bomb} compressed bgr8', data=data)
    with pytest.raises(ConversionError, match='frame declares 4096x4096, this camera sends 64x48: refused before'):
        compressed_to_rgb(msg, expected=(64, 48))
    assert decoded == [], 'decoded before the size was checked'
    monkeypatch.undo()
    good = rgb_to_compressed(RGB, bomb)
    assert compressed_to_rgb(good, expected=(64, 48)).shape == (48, 64, 3)


def test_a_raw_frame_of_another_size_is_refused_too():
    from vla_policy_node.ros.conversions import image_to_rgb, rgb_to_image
    with pytest.raises(ConversionError, match='frame declares 64x48, this camera sends 640x480'):
        image_to_rgb(rgb_to_image(RGB), expected=(640, 480))
    assert image_to_rgb(rgb_to_image(RGB), expected=(64, 48)).shape == (48, 64, 3)
