"""Recorded benchmark results, their tools, and the peer comparisons (`benchmarks.peers`): part of a checkout of
the repository, importable from its root (`python -m launch.bench --suite=train`), not installed with zaya_jax."""
