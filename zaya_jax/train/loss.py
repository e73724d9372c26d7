"""Token cross-entropy in fp32 with an optional z-loss, masked for padding and document boundaries."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax


class LossSums(NamedTuple):
    """Sums over the masked tokens of a (micro)batch; divide by `tokens` for means."""

    ce: jax.Array  # [] fp32 summed cross-entropy (nats)
    z: jax.Array  # [] fp32 summed logsumexp²
    tokens: jax.Array  # [] fp32 number of tokens that count


def lm_loss_sums(logits: jax.Array, labels: jax.Array, loss_mask: jax.Array) -> LossSums:
    """logits: [B, S, V] (cast to fp32), labels: [B, S] int, loss_mask: [B, S] (1 = counts) → LossSums."""
    chex.assert_rank(logits, 3)
    chex.assert_equal_shape([labels, loss_mask])
    logits = logits.astype(jnp.float32)
    mask = loss_mask.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return LossSums(jnp.sum(ce * mask), jnp.sum(lse * lse * mask), jnp.sum(mask))


def objective(sums: LossSums, z_loss: float) -> jax.Array:
    """The summed training objective: Σ CE + z_loss · Σ logsumexp² (divided by the token count later)."""
    return sums.ce + z_loss * sums.z
