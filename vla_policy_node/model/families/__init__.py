# SPDX-License-Identifier: Apache-2.0
"""The policy families: SmolVLA, and pi0 / pi0.5 on a PaliGemma backbone."""
