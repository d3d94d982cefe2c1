# SPDX-License-Identifier: Apache-2.0
"""The simulated robot's ROS node and the closed-loop evaluation through the node."""
