# SPDX-License-Identifier: Apache-2.0
"""
The simulated table-top robots (no ROS) and the policies trained on them.

``so101/`` is the SO-101 arm in MuJoCo, the demo's robot; the modules here are the planar
numpy arm the fast tests run on (``robots`` names both). Each trained policy ships inside
this package (package data), so it is found the same way from an editable ``pip install
-e .`` (the source tree) and from a colcon install (site-packages): ``python -m
vla_policy_node.sim checkpoint [so101|planar]`` prints its folder for shell scripts and the
Makefile.
"""

from pathlib import Path

PLANAR_CHECKPOINT = Path(__file__).resolve().parent / "touch_policy"
