# SPDX-License-Identifier: Apache-2.0
"""
Running a policy: preprocessing, one prefix pass, the denoising loop.

Eager, compiled or CUDA-graph code, the program cache and the shape buckets. No ROS.
"""
