# SPDX-License-Identifier: Apache-2.0
"""
The simulated table-top robots (no ROS) and the policies trained on them.

``so101/`` is the SO-101 arm in MuJoCo, the demo's robot; ``planar/`` the 3-joint numpy arm
the fast tests run on; ``robots`` names both and types the contract they share (``SimEnv``);
``scene`` is an episode's blocks and task, ``rollout`` runs episodes without ROS, ``trajectory``
follows a joint trajectory as joint_trajectory_controller does, ``recording`` saves an
episode's frames. Each trained policy ships inside its robot's package (package data), so it is
found the same way from an editable ``pip install -e .`` (the source tree) and from a colcon
install (site-packages): ``python -m vla_policy_node.sim checkpoint [so101|planar]`` prints its
folder for shell scripts and the Makefile. (``ros/sim/`` wraps these robots in ROS 2.)
"""

from vla_policy_node.sim.planar import SHIPPED_CHECKPOINT as PLANAR_CHECKPOINT

__all__ = ["PLANAR_CHECKPOINT"]
