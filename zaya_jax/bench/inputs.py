"""Synthetic inputs of the benchmarks: the quick (smoke-test) model and uniform random token batches."""

from __future__ import annotations

import numpy as np

# the `--quick` model of the bench suites: ~0.2M parameters, every block of the full model
QUICK_MODEL = dict(
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_q_heads=4,
    num_kv_heads=2,
    head_dim=16,
    num_experts=4,
    moe_intermediate_size=64,
    router_hidden_size=16,
    max_position_embeddings=256,
)


def make_batches(vocab: int, batch: int, seq: int, n: int, seed: int = 0) -> list[np.ndarray]:
    """n batches of token ids [batch, seq] in [1, vocab) (id 0 is HF's padding row)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=(batch, seq), dtype=np.int64) for _ in range(n)]
