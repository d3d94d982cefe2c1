# SPDX-License-Identifier: Apache-2.0
"""
The SO-101 arm in MuJoCo on a table with coloured blocks: the simulated robot of the demo.

``ASSETS`` holds the arm's MJCF and meshes (see its README for their origin) and the scene;
``SHIPPED_CHECKPOINT`` is the policy trained on it by ``make train``, package data as
``sim.SHIPPED_CHECKPOINT`` is. Joint positions are radians here, as on ``/joint_states``;
``units`` converts to LeRobot's SO-101 units, which the policy speaks.
"""

import os
from pathlib import Path

# MuJoCo picks its GL platform when first imported, and every module here imports it after this:
# headless EGL unless the user chose (MUJOCO_GL=osmesa also works; glfw needs a display).
os.environ.setdefault("MUJOCO_GL", "egl")
# Mesa's software rasterizer (llvmpipe, where there is no GPU) renders the 64x64 camera on the
# calling thread: the same pixels, a little less CPU, and no rasterizer threads woken on every
# core 30 times a second beside the policy (5 context switches a frame). Read when GL loads.
os.environ.setdefault("LP_NUM_THREADS", "0")

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "touch_policy"
