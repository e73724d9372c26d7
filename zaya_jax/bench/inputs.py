"""Synthetic inputs of the benchmarks: the quick (smoke-test) model and uniform random token batches."""

from __future__ import annotations

import numpy as np

from zaya_jax.config import GEOMETRY_FIELDS, load_config


def quick_model() -> dict:
    """The `--quick` model of the bench suites: the `tiny` variant's geometry (experiments/zaya1.py: every
    block of the full model at the smallest sizes), as `config.model` fields."""
    tiny = load_config("experiments/zaya1.py:tiny").model
    return {name: tiny[name] for name in GEOMETRY_FIELDS}


def make_batches(vocab: int, batch: int, seq: int, n: int, seed: int = 0) -> list[np.ndarray]:
    """n batches of token ids [batch, seq] in [1, vocab) (id 0 is HF's padding row)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=(batch, seq), dtype=np.int64) for _ in range(n)]
