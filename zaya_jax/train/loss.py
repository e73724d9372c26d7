"""Token cross-entropy in fp32 with an optional z-loss, masked for padding and document boundaries.

`chunked_objective` is what the train and eval steps use: the tied head and the log-softmax run over chunks
of the sequence (`train.loss_chunk` positions at a time), so no [B, S, V] fp32 logits array exists
(V = 262,272 for ZAYA1), and the backward pass reuses gradients computed chunk by chunk in the forward pass.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from zaya_jax.kernels import matmul as matmul_kernels


class LossSums(NamedTuple):
    """Sums over the masked tokens of a (micro)batch; divide by `tokens` for means."""

    ce: jax.Array  # [] fp32 summed cross-entropy (nats)
    z: jax.Array  # [] fp32 summed logsumexp²
    tokens: jax.Array  # [] fp32 number of tokens that count


def objective(sums: LossSums, z_loss: float) -> jax.Array:
    """The summed training objective: Σ CE + z_loss · Σ logsumexp² (divided by the token count later)."""
    return sums.ce + z_loss * sums.z


def _chunk_len(seq: int, limit: int) -> int:
    """The largest divisor of `seq` that is ≤ `limit` (≥ 1)."""
    return max(c for c in range(1, min(seq, max(limit, 1)) + 1) if seq % c == 0)


def chunked_objective(
    h: jax.Array,
    embed: jax.Array,
    labels: jax.Array,
    loss_mask: jax.Array,
    *,
    z_loss: float,
    chunk: int,
    blocks: int = 1,
    dtype=jnp.float32,
    matmul: str = "xla",
) -> tuple[jax.Array, LossSums]:
    """(Σ CE + z_loss · Σ logsumexp², LossSums) of the tied head `h @ embedᵀ` without materialising all logits.

    h: [B, S, H] final hidden states; embed: [V, H]; labels/loss_mask: [B, S]; dtype: the compute dtype of
    the head GEMMs (fp32 accumulation, fp32 logits); matmul: the model's matmul kernel (`Kernels.matmul`, for the
    head's weight gradient). The sequence is viewed as `blocks` contiguous blocks (the
    context-parallel shards of a GSPMD-sharded sequence, so no chunk straddles devices) of n chunks of at most
    `chunk` positions; a `lax.scan` over the chunks computes [B, blocks, c, V] logits at a time. Under
    differentiation the forward pass also computes the chunk's gradients (fused linear cross-entropy), so
    the backward pass neither stores nor recomputes logits: the head costs exactly its 6·T·V·H FLOPs.
    """
    chex.assert_rank(h, 3)
    chex.assert_equal_shape([labels, loss_mask])
    b, s, _ = h.shape
    c = _chunk_len(s // blocks, chunk)
    n = s // blocks // c
    layout = (b, blocks, n, c)
    split = lambda x: jnp.moveaxis(x.reshape(*layout, *x.shape[2:]), 2, 0)  # noqa: E731
    xs = (split(h.astype(dtype)), split(labels), split(loss_mask.astype(jnp.float32)))
    objective, sums = _fused_ce(xs, embed.astype(dtype), float(z_loss), matmul)
    return objective, LossSums(sums[0], sums[1], jnp.sum(loss_mask.astype(jnp.float32)))


def _chunk_stats(hx, lx, mx, w):
    """logits [.., V] fp32 of one chunk, their logsumexp, and the masked CE and z sums."""
    logits = jnp.einsum("...h,vh->...v", hx, w, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    ce = lse - jnp.take_along_axis(logits, lx[..., None], axis=-1)[..., 0]
    return logits, lse, jnp.stack([jnp.sum(ce * mx), jnp.sum(lse * lse * mx)])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused_ce(xs, w, z_loss, matmul):
    """xs = (h [n, ..., H], labels [n, ...], mask [n, ...]) chunks → (objective, [Σ CE, Σ lse²])."""

    def one(acc, x):
        return acc + _chunk_stats(*x, w)[2], None

    sums, _ = jax.lax.scan(one, jnp.zeros((2,), jnp.float32), xs)
    return sums[0] + z_loss * sums[1], sums


def _fused_ce_fwd(xs, w, z_loss, matmul):
    def one(carry, x):
        acc, dw = carry
        hx, lx, mx = x
        if matmul_kernels.flat_tokens_are_local():  # one token axis: the head's weight gradient contracts one axis
            lead = lx.ndim
            hx, lx, mx = (a.reshape(-1, *a.shape[lead:]) for a in x)
        logits, lse, sums = _chunk_stats(hx, lx, mx, w)
        p = jnp.exp(logits - lse[..., None])
        onehot = jax.nn.one_hot(lx, logits.shape[-1], dtype=jnp.float32)
        dlogits = ((p - onehot) + (2.0 * z_loss) * lse[..., None] * p) * mx[..., None]  # d objective / d logits
        dlogits = dlogits.astype(w.dtype)
        dh = jnp.einsum("...v,vh->...h", dlogits, w, preferred_element_type=jnp.float32).astype(hx.dtype)
        dw = dw + matmul_kernels.weight_grad(dlogits, hx, matmul)
        return (acc + sums, dw), dh.reshape(x[0].shape)

    init = (jnp.zeros((2,), jnp.float32), jnp.zeros(w.shape, jnp.float32))
    (sums, dw), dh = jax.lax.scan(one, init, xs)
    return (sums[0] + z_loss * sums[1], sums), (dh, dw.astype(w.dtype), xs[1])


def _fused_ce_bwd(matmul, res, cotangents):
    dh, dw, labels = res
    g = cotangents[0]  # only the objective is differentiated; the sums are metrics
    zeros_like_int = np.zeros(labels.shape, jax.dtypes.float0)
    return ((g * dh).astype(dh.dtype), zeros_like_int, None), (g * dw).astype(dw.dtype), None


_fused_ce.defvjp(_fused_ce_fwd, _fused_ce_bwd)
