# SPDX-License-Identifier: Apache-2.0
"""vla-policy-bench: a checkpoint's observation-to-chunk latency per stage, against the naive path and LeRobot."""
