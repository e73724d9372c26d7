"""The sampling filters of generation (`zaya_jax.inference.filter_logits`: temperature, top-k, top-p) against a
NumPy reference. Apart from tests/inference/test_inference.py, which builds its models with `transformers` (the
`reference` extra), so that these run on every CI leg."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from zaya_jax.inference import filter_logits


def test_filter_logits_numpy():
    logits = np.random.default_rng(7).normal(size=(4, 50)).astype(np.float32) * 3
    for top_k, top_p, temp in [(5, 1.0, 1.0), (0, 0.6, 0.8), (10, 0.5, 1.5), (0, 1.0, 1.0)]:
        out = np.asarray(filter_logits(jnp.asarray(logits), temp, top_k, top_p))
        for row in range(4):
            z = logits[row] / temp
            order = np.argsort(-z)
            k = top_k or z.size
            p = np.exp(z[order[:k]] - z[order[0]])
            p /= p.sum()
            n_keep = int(np.searchsorted(np.cumsum(p), top_p) + 1) if top_p < 1 else k
            expected = np.full(z.shape, -np.inf, np.float32)
            expected[order[:n_keep]] = z[order[:n_keep]]
            np.testing.assert_allclose(out[row], expected, rtol=1e-6)
