# SPDX-License-Identifier: Apache-2.0
"""Benchmarks: deterministic simulations and timing scripts that produce the BENCHMARKS.md figures."""
