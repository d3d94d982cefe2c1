# SPDX-License-Identifier: Apache-2.0
"""Run Vision-Language-Action policies (SmolVLA, pi0, pi0.5) in a ROS 2 control loop."""
