"""Token cross-entropy in fp32 with an optional z-loss, masked for padding and document boundaries.

`chunked_loss_sums` is what the train and eval steps use: the tied head and the log-softmax run over chunks
of the sequence (`train.loss_chunk` positions at a time), each chunk rematerialised in the backward pass, so
no [B, S, V] fp32 logits array exists (V = 262,272 for ZAYA1).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

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


def _chunk_len(seq: int, limit: int) -> int:
    """The largest divisor of `seq` that is ≤ `limit` (≥ 1)."""
    return max(c for c in range(1, min(seq, max(limit, 1)) + 1) if seq % c == 0)


def chunked_loss_sums(h: jax.Array, head: Callable[[jax.Array], jax.Array], labels: jax.Array,
                      loss_mask: jax.Array, chunk: int, blocks: int = 1) -> LossSums:
    """LossSums of `head(h)` without materialising all logits.

    h: [B, S, H] final hidden states; head: [..., H] → fp32 logits [..., V] (the tied LM head);
    labels/loss_mask: [B, S]. The sequence is viewed as `blocks` contiguous blocks (the context-parallel
    shards of a GSPMD-sharded sequence, so no chunk straddles devices) of `n` chunks of at most `chunk`
    positions; a `lax.scan` over the n chunks computes [B, blocks, c, V] logits at a time, rematerialised in
    the backward pass (`jax.checkpoint`).
    """
    chex.assert_rank(h, 3)
    chex.assert_equal_shape([labels, loss_mask])
    b, s, hid = h.shape
    c = _chunk_len(s // blocks, chunk)
    n = s // blocks // c
    split = lambda x: jnp.moveaxis(x.reshape(b, blocks, n, c, *x.shape[2:]), 2, 0)  # noqa: E731

    @jax.checkpoint
    def one(carry, xs):
        hx, lx, mx = xs
        logits = head(hx).astype(jnp.float32)  # [B, blocks, c, V]
        lse = jax.nn.logsumexp(logits, axis=-1)
        ce = lse - jnp.take_along_axis(logits, lx[..., None], axis=-1)[..., 0]
        m = mx.astype(jnp.float32)
        return carry + jnp.stack([jnp.sum(ce * m), jnp.sum(lse * lse * m)]), None

    sums, _ = jax.lax.scan(one, jnp.zeros((2,), jnp.float32), (split(h), split(labels), split(loss_mask)))
    return LossSums(sums[0], sums[1], jnp.sum(loss_mask.astype(jnp.float32)))
