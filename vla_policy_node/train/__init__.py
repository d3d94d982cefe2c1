# SPDX-License-Identifier: Apache-2.0
"""Training a small SmolVLA-style policy on the simulated table-top task (flow matching, CPU)."""
