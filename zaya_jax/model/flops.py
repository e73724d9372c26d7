"""Analytic training FLOPs (arXiv 2511.17127; docs/architecture.md §10): 6·(active non-embedding + tied head)
per token plus
causal attention 6·L·n_q·d·S per token (QK and AV, forward + backward, half the square)."""

from __future__ import annotations

import ml_collections


def active_matmul_params(m: ml_collections.ConfigDict) -> int:
    """Weights a token multiplies through (one routed expert), head included; norms etc. are negligible."""
    h, d, nq, nkv = m.hidden_size, m.head_dim, m.num_q_heads, m.num_kv_heads
    r, i, c = m.router_hidden_size, m.moe_intermediate_size, (nq + nkv) * m.head_dim
    attn = h * nq * d + h * nkv * d + h * nkv * d + nq * d * h + m.cca_time1 * c * d + m.cca_time0 * c
    router = h * r + 2 * r * r + r * (m.num_experts + 1)
    expert = 3 * h * i * m.num_experts_per_tok
    return m.num_layers * (attn + router + expert) + m.vocab_size * h


def train_flops_per_token(m: ml_collections.ConfigDict, seq_len: int) -> float:
    attention = 6 * m.num_layers * m.num_q_heads * m.head_dim * seq_len
    return 6.0 * active_matmul_params(m) + attention
