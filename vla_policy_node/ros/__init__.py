# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 layer: parameters, QoS, message conversions, diagnostics and the node itself."""
