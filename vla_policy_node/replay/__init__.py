# SPDX-License-Identifier: Apache-2.0
"""Replay a recorded episode (MCAP) through the policy offline: ``vla-policy-replay``."""
