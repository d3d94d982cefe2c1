# SPDX-License-Identifier: Apache-2.0
"""
The simulated table-top robot (pure numpy, no ROS) and the policy trained on it.

``SHIPPED_CHECKPOINT`` is the trained policy that ships inside this package (package
data), so it is found the same way from an editable ``pip install -e .`` (the source
tree) and from a colcon install (site-packages): ``python -m vla_policy_node.sim
checkpoint`` prints the folder for shell scripts and the Makefile.
"""

from pathlib import Path

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent / "touch_policy"
