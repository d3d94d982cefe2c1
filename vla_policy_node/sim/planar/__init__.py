# SPDX-License-Identifier: Apache-2.0
"""
The planar test arm: 3 joints in numpy, a top camera, the touch task and its shipped policy.

No physics and rendering in microseconds, so the DDS tests of the node's execution run on it
fast; users meet the SO-101 (``sim/so101/``). ``SHIPPED_CHECKPOINT`` is its policy, package data.
"""

from pathlib import Path

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "touch_policy"
