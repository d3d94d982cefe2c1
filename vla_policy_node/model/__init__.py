# SPDX-License-Identifier: Apache-2.0
"""
The network, in torch and nothing else.

Attention, blocks, RoPE, the ViT, the prefix cache, flow matching and RTC, preprocessing and
normalization; ``families/`` holds SmolVLA and PaliGemma (pi0, pi0.5). No ROS.
"""
