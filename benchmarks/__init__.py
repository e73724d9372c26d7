"""Recorded benchmark results, their tools, and the peer comparisons (`benchmarks.peers`): part of a checkout of
the repository, importable from its root (`python -m benchmarks.peers`), not installed with zaya_jax."""
