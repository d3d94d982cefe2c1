# SPDX-License-Identifier: Apache-2.0
"""The ROS-free core: models, prefix cache, runtime, preprocessing, chunk scheduling, safety."""
