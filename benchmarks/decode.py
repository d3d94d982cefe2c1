# SPDX-License-Identifier: Apache-2.0
"""
Camera frame conversion cost at the tick: raw rgb8 vs image_transport's jpeg and png.

    python -m benchmarks.decode [--width 640 --height 480 --repeats 200]

The frame is a synthetic scene (smooth shading, edges and sensor-like noise), encoded with
compressed_image_transport's defaults (jpeg_quality 95, png_level 3). Times are medians of
``--repeats`` calls of what the node runs per frame: ``image_to_rgb`` for raw frames,
``compressed_to_rgb`` (Pillow) for compressed ones.
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage

from vla_policy_node.ros.compressed import compressed_to_rgb
from vla_policy_node.ros.conversions import image_to_rgb, rgb_to_image


def scene(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Return a camera-like uint8 RGB frame (H, W, 3): shading, a few objects, noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    rgb = np.stack([120 + 80 * x, 100 + 60 * y, 90 + 40 * (x * y)], axis=-1)
    for _ in range(12):
        cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.12)
        rgb[(y - cy * height / max(height, width)) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    rgb += rng.normal(0, 4, rgb.shape)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def median_ms(function, repeats: int) -> float:
    """Median wall time of ``function()`` in milliseconds (after two warm-up calls)."""
    function()
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main(argv: list[str] | None = None) -> dict:
    """Measure and print; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--width', type=int, default=640)
    parser.add_argument('--height', type=int, default=480)
    parser.add_argument('--repeats', type=int, default=200)
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    rgb = scene(args.height, args.width)
    raw = rgb_to_image(rgb)
    results = {'raw rgb8': (median_ms(lambda: image_to_rgb(raw), args.repeats), len(raw.data))}
    for codec, options, fmt in (('jpeg', {'quality': 95}, 'JPEG'), ('png', {'compress_level': 3}, 'PNG')):
        stream = io.BytesIO()
        PILImage.fromarray(rgb).save(stream, format=fmt, **options)
        msg = CompressedImage(format=f'rgb8; {codec} compressed bgr8', data=stream.getvalue())
        results[codec] = (median_ms(lambda msg=msg: compressed_to_rgb(msg), args.repeats), len(msg.data))
    print(f'{args.width}x{args.height} frame, median of {args.repeats} (Pillow {PILImage.__version__})')
    for name, (ms, size) in results.items():
        print(f'  {name:<9} {ms:7.3f} ms   {size / 1024:7.1f} KiB on the wire')
    figures = {name: {'ms': ms, 'bytes': size} for name, (ms, size) in results.items()}
    if args.json:
        with open(args.json, 'w', encoding='utf-8') as stream:
            json.dump(figures, stream, indent=2)
    return figures


if __name__ == '__main__':
    main()
