"""Benchmarks: deterministic simulations and timing scripts that produce the BENCHMARKS.md figures."""
