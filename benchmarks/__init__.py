# SPDX-License-Identifier: Apache-2.0
"""Benchmarks only developers run, from the repository root (``python -m benchmarks.NAME``); not installed."""
