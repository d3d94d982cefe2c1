# SPDX-License-Identifier: Apache-2.0
"""Batching several robots' requests into one policy pass (no ROS; its node is ``ros/server``)."""
