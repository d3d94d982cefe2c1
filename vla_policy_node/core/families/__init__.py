# SPDX-License-Identifier: Apache-2.0
"""Model families (SmolVLA, pi0, pi0.5) built on the shared blocks in ``vla_policy_node.core``."""
