"""Parameter counts from the model's abstract init (§10): nothing is allocated."""

from __future__ import annotations

import math

import jax
import ml_collections
from flax import nnx

from zaya_jax.model.zaya import abstract_model


def param_counts(m: ml_collections.ConfigDict) -> dict[str, int]:
    """Counts as Hugging Face reports them for the same config.

    The stacked layout carries an `eda_scale` for the first router too (it keeps the scan uniform);
    that vector is dead (the first router gets a zero state) and HF has no such tensor, so it is
    not counted. Active = one routed expert per token.
    """
    state = nnx.state(abstract_model(m), nnx.Param)
    stored = sum(math.prod(x.shape) for x in jax.tree.leaves(state))
    total = stored - m.router_hidden_size
    embedding = m.vocab_size * m.hidden_size
    expert = 3 * m.hidden_size * m.moe_intermediate_size
    non_embedding = total - embedding
    active = non_embedding - m.num_layers * (m.num_experts - m.num_experts_per_tok) * expert
    return {
        "total": total,
        "non_embedding": non_embedding,
        "active_non_embedding": active,
        "embedding": embedding,
        "active": active + embedding,
    }
