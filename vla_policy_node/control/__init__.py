# SPDX-License-Identifier: Apache-2.0
"""
The control loop, numpy only (a test forbids torch and rclpy).

Chunk scheduling, the safety gate, observations, health, the inference worker, joint maps.
"""
